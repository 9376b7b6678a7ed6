"""Paddle Inference predictors: TensorRT or plain CUDA on GPUs, oneDNN on CPUs.

The ``paddle.inference.Config`` calls are kept as data (``predictor_settings``), so the
TensorRT set-up is checked on machines whose Paddle has no TensorRT (it raises as soon as
TensorRT is switched on).
"""

import os
import sys
from dataclasses import dataclass
from typing import List, Tuple

import paddle
import paddle.inference as paddle_infer
from paddle.inference import PrecisionType

from paddle_resnet.core import bootstrap, feeds, paddle_internals
from paddle_resnet.core.bootstrap import native_chatter
from paddle_resnet.core.devices import cpu_has_int8_dot_products
from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.deploy import exported
from paddle_resnet.deploy.classifier_input import checked_batch


@dataclass(frozen=True)
class ConfigCall:
    """One method call on a ``paddle.inference.Config``."""

    method: str
    args: Tuple = ()
    kwargs: Tuple = ()  # sorted (name, value) pairs, so the call stays hashable

    def apply(self, target):
        return getattr(target, self.method)(*self.args, **dict(self.kwargs))


def _call(method, *args, **kwargs):
    return ConfigCall(method, args, tuple(sorted(kwargs.items())))


def cpu_supports_bf16():
    return paddle_internals.supports_bf16()


def workspace_bytes(size):
    """--trt-workspace-size in MB; NVIDIA's scripts pass bytes (1 << 30) to the same flag
    name (--workspace-size), so a value of 2^20 or more is bytes already."""
    return size if size >= 1 << 20 else size << 20


def predictor_settings(
    inference_config, backend, input_shape, max_batch, quantized=False, pir_export=False
):
    """The ``paddle.inference.Config`` calls for ``backend``."""
    inf = inference_config
    if backend != "trt" and inf.trt_precision != "FP32":
        raise ConfigError(f"--trt-precision {inf.trt_precision} needs --backend trt, not {backend}")
    if backend not in ("cpu", "openvino") and inf.cpu_precision != "fp32":
        raise ConfigError(
            f"--cpu-precision {inf.cpu_precision} needs --backend cpu or openvino, not {backend}"
        )
    if inf.cpu_precision == "bf16" and not cpu_supports_bf16():
        raise ConfigError(
            "--cpu-precision bf16: this CPU has no bfloat16 support (avx512_bf16 / AMX)"
        )
    if inf.cpu_precision == "int8" and pir_export:
        raise ConfigError(
            "--cpu-precision int8 on a PIR export (inference.json): Paddle 3 has no oneDNN "
            "int8 passes for PIR programs; its int8 runs from model.onnx with --backend "
            "openvino or onnxruntime (or export with --ir legacy)"
        )
    int8 = inf.cpu_precision == "int8" or inf.trt_precision == "INT8"
    if int8 and not quantized and not (backend == "trt" and inf.trt_use_calib_mode):
        raise ConfigError(
            "INT8 needs a model with quantization scales: export it with "
            "--ptq-algo (or, on TensorRT, calibrate with --trt-use-calib-mode)"
        )
    if inf.cpu_precision == "int8" and not cpu_has_int8_dot_products():
        raise ConfigError(
            "--cpu-precision int8: this CPU has no int8 dot products "
            "(avx512_vnni / avx_vnni / AMX); oneDNN int8 would be slower than fp32"
        )
    calls: List[ConfigCall] = [_call("switch_ir_optim", True)]
    if not pir_export:  # Paddle 3.3.1's PIR predictor fails with it (pass_result_info.h:48)
        calls.append(_call("enable_memory_optim"))
    elif quantized:
        # Paddle 3.3.1's constant folding runs the fake-quantize ops of the weights and
        # fails on their unset state outputs ("Tensor holds no memory"): they run as built.
        calls.append(_call("delete_pass", "constant_folding_pass"))
    if backend == "cpu":
        calls.append(_call("disable_gpu"))
        threads = inf.cpu_threads or len(os.sched_getaffinity(0))
        calls.append(_call("set_cpu_math_library_num_threads", threads))
        calls.append(_call("enable_mkldnn"))
        if inf.cpu_precision == "bf16":
            calls.append(_call("enable_mkldnn_bfloat16"))
        if inf.cpu_precision == "int8":
            calls.append(_call("enable_mkldnn_int8"))
        return calls
    calls.append(_call("enable_use_gpu", 1024, inf.device_id))
    if backend == "gpu":
        return calls
    precision = {
        "FP32": PrecisionType.Float32,
        "FP16": PrecisionType.Half,
        "INT8": PrecisionType.Int8,
    }[inf.trt_precision]
    calls.append(
        _call(
            "enable_tensorrt_engine",
            workspace_size=workspace_bytes(inf.trt_workspace_size),
            max_batch_size=max_batch,
            min_subgraph_size=inf.trt_min_subgraph_size,
            precision_mode=precision,
            use_static=inf.trt_use_static,
            # a quantized model's own scales need no calibration
            use_calib_mode=int8 and inf.trt_use_calib_mode and not quantized,
        )
    )
    smallest, largest = {feeds.IMAGE: [1, *input_shape]}, {feeds.IMAGE: [max_batch, *input_shape]}
    calls.append(_call("set_trt_dynamic_shape_info", smallest, largest, largest))
    return calls


# Paddle 3.3's oneDNN instructions cannot convert some PIR attributes (Paddle #77340,
# e.g. interpolate's list of scales), for .json and .pdmodel models alike (Paddle 3
# runs both as PIR): the first run raises NotImplementedError naming this.
ONEDNN_PIR_GAP = "ConvertPirAttribute2RuntimeAttribute"


class Classifier:
    """A Paddle Inference predictor: float images in, class probabilities out. An fp32
    model that oneDNN cannot run on Paddle 3.3 (``ONEDNN_PIR_GAP``) runs on Paddle's plain
    CPU kernels instead, with a notice."""

    def __init__(self, model_dir, calls, input_shape):
        self.model_dir, self.calls = model_dir, list(calls)
        self.input_shape = tuple(input_shape)
        self._create()

    def _create(self):
        config = paddle_infer.Config(*exported.model_paths(self.model_dir))
        for call in self.calls:
            call.apply(config)
        config.disable_glog_info()
        try:
            with native_chatter(bootstrap.verbose()):
                self.predictor = paddle_infer.create_predictor(config)
        except Exception as err:  # Paddle raises its own error types here
            raise UserError(
                f"{self.model_dir}: cannot create a predictor ({str(err).strip().splitlines()[-1]})"
            ) from None
        self.input = self.predictor.get_input_handle(self.predictor.get_input_names()[0])
        self.output = self.predictor.get_output_handle(self.predictor.get_output_names()[0])

    def __call__(self, images):
        images = checked_batch(images, self.input_shape)
        self.input.reshape(list(images.shape))
        self.input.copy_from_cpu(images)
        try:
            self.predictor.run()
        except NotImplementedError as err:
            if ONEDNN_PIR_GAP not in str(err):
                raise
            self._without_onednn()
            return self(images)
        return self.output.copy_to_cpu()

    def _without_onednn(self):
        """Rebuilt on Paddle's plain CPU kernels (fp32 only: bf16 and int8 are oneDNN's)."""
        methods = {call.method for call in self.calls}
        where = (
            f"{self.model_dir}: Paddle {paddle.__version__}'s oneDNN "
            "cannot run this model (Paddle #77340)"
        )
        if methods & {"enable_mkldnn_bfloat16", "enable_mkldnn_int8"}:
            raise UserError(f"{where}; run it in fp32 or with --backend openvino")
        self.calls = [c for c in self.calls if c.method != "enable_mkldnn"]
        self.calls.append(_call("disable_mkldnn"))
        print(f"warning: {where}: running Paddle's plain CPU kernels (slower)", file=sys.stderr)
        self._create()
