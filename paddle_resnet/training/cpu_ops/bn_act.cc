// Batch norm over the batch's statistics, fused with the residual addition and the ReLU
// that follow it in a ResNet block, forward and backward, for CPU training: fp32 or bf16
// activations (bf16 read and written as such, computed in fp32), fp32 parameters and
// statistics. Paddle's CPU batch norm takes fp32 only, so a bf16 program paid a cast on
// each side of every batch norm and a pass each for the addition and the ReLU (and their
// gradients); this reads its input twice and writes its output once, each way.
//
// Ops: prn_bn_act (x, scale, bias, mean, variance) and prn_bn_add_act (the same and a
// residual). mean and variance are the running statistics, updated in place as Paddle's
// batch_norm does (momentum * running + (1 - momentum) * batch, the variance biased).
// Layout NCHW; the channel loop is parallel (OpenMP), each channel's rows contiguous.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "paddle/extension.h"

namespace {

using bf16 = uint16_t;

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) {
  uint32_t bits = uint32_t(p[i]) << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}
inline void store(float* p, int64_t i, float value) { p[i] = value; }
inline void store(bf16* p, int64_t i, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  // Round to nearest even; a NaN stays a NaN (rounding could carry it into infinity).
  uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  p[i] = bf16((bits & 0x7FFFFFFFu) > 0x7F800000u ? (bits >> 16) | 0x40u : rounded);
}
// max(v, 0) that keeps a NaN (a diverging run must see it in its loss).
inline float relu(float v) { return v < 0.f ? 0.f : v; }

struct Shape {
  int64_t n, c, hw;
  double count() const { return double(n) * double(hw); }
};

Shape shape_of(const paddle::Tensor& x) {
  auto dims = x.shape();
  PD_CHECK(dims.size() == 4, "prn_bn_act takes NCHW activations, got rank ", dims.size());
  return {dims[0], dims[1], dims[2] * dims[3]};
}

template <typename T, bool kResidual, bool kRelu>
void forward(const T* x, const T* residual, const float* gamma, const float* beta,
             float* running_mean, float* running_var, T* y, float* saved_mean,
             float* saved_invstd, Shape s, float epsilon, float momentum) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < s.c; ++c) {
    // Sums of x - shift: no cancellation where a channel's mean is far from zero.
    const float shift = load(x, c * s.hw);
    double sum = 0, squares = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      const T* row = x + (n * s.c + c) * s.hw;
      float row_sum = 0, row_squares = 0;
#pragma omp simd reduction(+ : row_sum, row_squares)
      for (int64_t i = 0; i < s.hw; ++i) {
        const float d = load(row, i) - shift;
        row_sum += d;
        row_squares += d * d;
      }
      sum += row_sum;
      squares += row_squares;
    }
    const double shifted_mean = sum / s.count();
    const double variance = std::fmax(squares / s.count() - shifted_mean * shifted_mean, 0.0);
    const float mean = float(shift + shifted_mean);
    const float invstd = float(1.0 / std::sqrt(variance + epsilon));
    saved_mean[c] = mean;
    saved_invstd[c] = invstd;
    running_mean[c] = momentum * running_mean[c] + (1.f - momentum) * mean;
    running_var[c] = momentum * running_var[c] + (1.f - momentum) * float(variance);
    const float a = gamma[c] * invstd, b = beta[c] - mean * a;
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t offset = (n * s.c + c) * s.hw;
      const T* row = x + offset;
      T* out = y + offset;
#pragma omp simd
      for (int64_t i = 0; i < s.hw; ++i) {
        float v = a * load(row, i) + b;
        if (kResidual) v += load(residual + offset, i);
        store(out, i, kRelu ? relu(v) : v);
      }
    }
  }
}

template <typename T, bool kResidual, bool kRelu>
void backward(const T* x, const T* y, const T* dy, const float* gamma, const float* saved_mean,
              const float* saved_invstd, T* dx, T* dresidual, float* dgamma, float* dbeta,
              Shape s) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < s.c; ++c) {
    const float mean = saved_mean[c], invstd = saved_invstd[c];
    double grad_sum = 0, grad_dot = 0;  // sum(g), sum(g * (x - mean))
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t offset = (n * s.c + c) * s.hw;
      float row_sum = 0, row_dot = 0;
#pragma omp simd reduction(+ : row_sum, row_dot)
      for (int64_t i = 0; i < s.hw; ++i) {
        const float g = (!kRelu || load(y + offset, i) > 0.f) ? load(dy + offset, i) : 0.f;
        row_sum += g;
        row_dot += g * (load(x + offset, i) - mean);
      }
      grad_sum += row_sum;
      grad_dot += row_dot;
    }
    dbeta[c] = float(grad_sum);
    dgamma[c] = float(grad_dot * invstd);
    // dx = gamma * invstd * (g - mean(g) - xhat * mean(g * xhat))
    const float k = gamma[c] * invstd;
    const float mean_grad = float(grad_sum / s.count());
    const float slope = float(grad_dot / s.count()) * invstd * invstd;
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t offset = (n * s.c + c) * s.hw;
#pragma omp simd
      for (int64_t i = 0; i < s.hw; ++i) {
        const float g = (!kRelu || load(y + offset, i) > 0.f) ? load(dy + offset, i) : 0.f;
        store(dx + offset, i, k * (g - mean_grad - (load(x + offset, i) - mean) * slope));
        if (kResidual) store(dresidual + offset, i, g);
      }
    }
  }
}

template <typename T>
const T* data_of(const paddle::Tensor& t) {
  return reinterpret_cast<const T*>(t.data());
}
template <typename T>
T* data_of(paddle::Tensor& t) {
  return reinterpret_cast<T*>(t.data());
}

// The kernels index NCHW memory. PIR hands a custom operator a oneDNN op's output in
// oneDNN's own (blocked) layout, unconverted, where the legacy executor converts it: read
// as NCHW it gave wrong values (ResNet-18's first loss 2.67 for 2.44), so it is refused.
void check_plain(const paddle::Tensor& t, const char* name) {
  PD_CHECK(t.layout() != phi::DataLayout::ONEDNN, "prn_bn_act: ", name,
           " is in oneDNN's layout (a oneDNN op before it on PIR); NCHW memory expected");
}

void check_inputs(const paddle::Tensor& x, const paddle::Tensor& scale) {
  PD_CHECK(x.is_cpu(), "prn_bn_act is a CPU kernel");
  check_plain(x, "X");
  PD_CHECK(x.dtype() == paddle::DataType::FLOAT32 || x.dtype() == paddle::DataType::BFLOAT16,
           "prn_bn_act takes float32 or bfloat16 activations");
  PD_CHECK(scale.dtype() == paddle::DataType::FLOAT32, "prn_bn_act takes float32 parameters");
}

template <bool kResidual>
std::vector<paddle::Tensor> run_forward(const paddle::Tensor& x, const paddle::Tensor* residual,
                                        const paddle::Tensor& scale, const paddle::Tensor& bias,
                                        paddle::Tensor& mean, paddle::Tensor& variance,
                                        float epsilon, float momentum, bool with_relu) {
  check_inputs(x, scale);
  const Shape s = shape_of(x);
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  auto saved_mean = paddle::empty({s.c}, paddle::DataType::FLOAT32, x.place());
  auto saved_invstd = paddle::empty({s.c}, paddle::DataType::FLOAT32, x.place());
  auto go = [&](auto tag, auto relu_tag) {
    using T = decltype(tag);
    constexpr bool kRelu = decltype(relu_tag)::value;
    forward<T, kResidual, kRelu>(
        data_of<T>(x), residual ? data_of<T>(*residual) : nullptr, scale.data<float>(),
        bias.data<float>(), mean.data<float>(), variance.data<float>(), data_of<T>(y),
        saved_mean.data<float>(), saved_invstd.data<float>(), s, epsilon, momentum);
  };
  const bool is_bf16 = x.dtype() == paddle::DataType::BFLOAT16;
  if (is_bf16 && with_relu) go(bf16{}, std::true_type{});
  if (is_bf16 && !with_relu) go(bf16{}, std::false_type{});
  if (!is_bf16 && with_relu) go(float{}, std::true_type{});
  if (!is_bf16 && !with_relu) go(float{}, std::false_type{});
  return {y, saved_mean, saved_invstd};
}

template <bool kResidual>
std::vector<paddle::Tensor> run_backward(const paddle::Tensor& x, const paddle::Tensor& scale,
                                         const paddle::Tensor& saved_mean,
                                         const paddle::Tensor& saved_invstd,
                                         const paddle::Tensor& y, const paddle::Tensor& dy,
                                         bool with_relu) {
  check_plain(dy, "the gradient of Y");
  const Shape s = shape_of(x);
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dresidual = paddle::empty(kResidual ? x.shape() : std::vector<int64_t>{0}, x.dtype(),
                                 x.place());
  auto dgamma = paddle::empty({s.c}, paddle::DataType::FLOAT32, x.place());
  auto dbeta = paddle::empty({s.c}, paddle::DataType::FLOAT32, x.place());
  auto go = [&](auto tag, auto relu_tag) {
    using T = decltype(tag);
    constexpr bool kRelu = decltype(relu_tag)::value;
    backward<T, kResidual, kRelu>(data_of<T>(x), data_of<T>(y), data_of<T>(dy),
                                  scale.data<float>(), saved_mean.data<float>(),
                                  saved_invstd.data<float>(), data_of<T>(dx),
                                  kResidual ? data_of<T>(dresidual) : nullptr,
                                  dgamma.data<float>(), dbeta.data<float>(), s);
  };
  const bool is_bf16 = x.dtype() == paddle::DataType::BFLOAT16;
  if (is_bf16 && with_relu) go(bf16{}, std::true_type{});
  if (is_bf16 && !with_relu) go(bf16{}, std::false_type{});
  if (!is_bf16 && with_relu) go(float{}, std::true_type{});
  if (!is_bf16 && !with_relu) go(float{}, std::false_type{});
  if (kResidual) return {dx, dgamma, dbeta, dresidual};
  return {dx, dgamma, dbeta};
}

std::vector<paddle::Tensor> BnActForward(const paddle::Tensor& x, const paddle::Tensor& scale,
                                         const paddle::Tensor& bias, paddle::Tensor& mean,
                                         paddle::Tensor& variance, float epsilon,
                                         float momentum, bool relu) {
  return run_forward<false>(x, nullptr, scale, bias, mean, variance, epsilon, momentum, relu);
}

std::vector<paddle::Tensor> BnAddActForward(const paddle::Tensor& x,
                                            const paddle::Tensor& residual,
                                            const paddle::Tensor& scale,
                                            const paddle::Tensor& bias, paddle::Tensor& mean,
                                            paddle::Tensor& variance, float epsilon,
                                            float momentum, bool relu) {
  PD_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype(),
           "prn_bn_add_act: the residual differs from x in shape or dtype");
  check_plain(residual, "Residual");
  return run_forward<true>(x, &residual, scale, bias, mean, variance, epsilon, momentum, relu);
}

std::vector<paddle::Tensor> BnActBackward(const paddle::Tensor& x, const paddle::Tensor& scale,
                                          const paddle::Tensor& saved_mean,
                                          const paddle::Tensor& saved_invstd,
                                          const paddle::Tensor& y, const paddle::Tensor& dy,
                                          bool relu) {
  return run_backward<false>(x, scale, saved_mean, saved_invstd, y, dy, relu);
}

std::vector<paddle::Tensor> BnAddActBackward(const paddle::Tensor& x,
                                             const paddle::Tensor& scale,
                                             const paddle::Tensor& saved_mean,
                                             const paddle::Tensor& saved_invstd,
                                             const paddle::Tensor& y, const paddle::Tensor& dy,
                                             bool relu) {
  return run_backward<true>(x, scale, saved_mean, saved_invstd, y, dy, relu);
}

using Shapes = std::vector<std::vector<int64_t>>;
using Dtypes = std::vector<paddle::DataType>;

Shapes ForwardShape(const std::vector<int64_t>& x, const std::vector<int64_t>& scale) {
  return {x, scale, scale};
}
Dtypes ForwardDtype(const paddle::DataType& x, const paddle::DataType& scale) {
  return {x, scale, scale};
}
Shapes AddForwardShape(const std::vector<int64_t>& x, const std::vector<int64_t>& residual,
                       const std::vector<int64_t>& scale) {
  return {x, scale, scale};
}
Dtypes AddForwardDtype(const paddle::DataType& x, const paddle::DataType& residual,
                       const paddle::DataType& scale) {
  return {x, scale, scale};
}
Shapes BackwardShape(const std::vector<int64_t>& x, const std::vector<int64_t>& scale) {
  return {x, scale, scale};
}
Dtypes BackwardDtype(const paddle::DataType& x, const paddle::DataType& scale) {
  return {x, scale, scale};
}
Shapes AddBackwardShape(const std::vector<int64_t>& x, const std::vector<int64_t>& scale) {
  return {x, scale, scale, x};
}
Dtypes AddBackwardDtype(const paddle::DataType& x, const paddle::DataType& scale) {
  return {x, scale, scale, x};
}

}  // namespace

PD_BUILD_OP(prn_bn_act)
    .Inputs({"X", "Scale", "Bias", "Mean", "Variance"})
    .Outputs({"Y", "SavedMean", "SavedInvStd", "MeanOut", "VarianceOut"})
    .Attrs({"epsilon: float", "momentum: float", "relu: bool"})
    .SetInplaceMap({{"Mean", "MeanOut"}, {"Variance", "VarianceOut"}})
    .SetKernelFn(PD_KERNEL(BnActForward))
    .SetInferShapeFn(PD_INFER_SHAPE(ForwardShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(ForwardDtype));

PD_BUILD_GRAD_OP(prn_bn_act)
    .Inputs({"X", "Scale", "SavedMean", "SavedInvStd", "Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Scale"), paddle::Grad("Bias")})
    .Attrs({"relu: bool"})
    .SetKernelFn(PD_KERNEL(BnActBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(BackwardShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(BackwardDtype));

PD_BUILD_OP(prn_bn_add_act)
    .Inputs({"X", "Residual", "Scale", "Bias", "Mean", "Variance"})
    .Outputs({"Y", "SavedMean", "SavedInvStd", "MeanOut", "VarianceOut"})
    .Attrs({"epsilon: float", "momentum: float", "relu: bool"})
    .SetInplaceMap({{"Mean", "MeanOut"}, {"Variance", "VarianceOut"}})
    .SetKernelFn(PD_KERNEL(BnAddActForward))
    .SetInferShapeFn(PD_INFER_SHAPE(AddForwardShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AddForwardDtype));

PD_BUILD_GRAD_OP(prn_bn_add_act)
    .Inputs({"X", "Scale", "SavedMean", "SavedInvStd", "Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Scale"), paddle::Grad("Bias"),
              paddle::Grad("Residual")})
    .Attrs({"relu: bool"})
    .SetKernelFn(PD_KERNEL(BnAddActBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(AddBackwardShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AddBackwardDtype));
