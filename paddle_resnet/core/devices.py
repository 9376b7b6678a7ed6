"""Which device a process computes on, and why: the Paddle build (CPU or GPU), the GPUs
it can use, and one-line refusals of GPU-only options where there is none. The two are
kept apart: ``paddlepaddle-gpu`` inserts fp16 casts into AMP programs whether or not a
GPU is present, and on a machine without a usable GPU it runs on the CPU.
"""

import os

import paddle
import paddle.inference as paddle_inference

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.errors import ConfigError


def cuda_build():
    """True for the GPU build of Paddle (CUDA kernels compiled in), GPU or not."""
    return paddle.is_compiled_with_cuda()


def gpu_count():
    """The GPUs this process can use (0 on the CPU build or without a driver)."""
    return paddle.device.cuda.device_count() if cuda_build() else 0


def gpu_available():
    return gpu_count() > 0


def build_name():
    return f"paddlepaddle{'-gpu' if cuda_build() else ''} {paddle.__version__}"


def why_no_gpu():
    """Why this process has no GPU, as the end of a sentence."""
    if not cuda_build():
        return f"this Paddle is the CPU build ({build_name()})"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    cause = (
        "CUDA_VISIBLE_DEVICES is empty"
        if hidden is not None and not hidden.strip()
        else "no NVIDIA driver or GPU found"
    )
    return f"this Paddle is the GPU build ({build_name()}) but finds no usable GPU ({cause})"


def require_gpu(option, purpose):
    if not gpu_available():
        raise ConfigError(f"{option} needs an NVIDIA GPU ({purpose}); {why_no_gpu()}")


def check_training_options(config):
    """The training options that need a GPU, refused in one line where there is none (the
    GPU build would fail inside Paddle with a kernel error, the CPU build train in fp32)."""
    if config.amp.enabled and config.amp.dtype == "float16":
        require_gpu(
            "--use-pure-fp16" if config.amp.use_pure_fp16 else "--amp",
            "fp16 kernels exist for CUDA only",
        )
    elif config.amp.enabled and config.amp.use_pure_fp16:  # bf16 O1 trains on CPUs
        require_gpu(
            "--use-pure-fp16 with --amp-dtype bfloat16",
            "Paddle's CPU optimizer kernels take no bfloat16 weights",
        )
    elif config.amp.enabled and not gpu_available() and not paddle_internals.supports_bf16():
        # Paddle's bf16 CPU kernels need AVX512-BF16 or AMX; elsewhere the first step
        # failed inside the executor with "RuntimeError: std::exception".
        raise ConfigError(
            "--amp --amp-dtype bfloat16 on the CPU needs AVX512-BF16 or AMX, which this "
            "CPU lacks: train in fp32 (without --amp)"
        )
    if config.run.sync_bn:
        require_gpu(
            "--sync-bn",
            "Paddle has no CPU sync_batch_norm, and Fleet keeps per-rank batch norm on CPU ranks",
        )


def device():
    """(place, DALI device id or None) for this process: its GPU, or the CPU."""
    if gpu_available():
        device_id = int(os.environ.get("FLAGS_selected_gpus", "0").split(",")[0])
        return paddle.CUDAPlace(device_id), device_id
    return paddle.CPUPlace(), None


def describe(device_id):
    """This process's device in a few words: "GPU 0 (NVIDIA A100-SXM4-80GB)", "CPU", "CPU: ..."."""
    if device_id is not None:
        return f"GPU {device_id} ({paddle.device.cuda.get_device_name(device_id)})"
    return f"CPU: {why_no_gpu()}" if cuda_build() else "CPU"


def tensorrt_version():
    """The TensorRT version Paddle can load ("8.5.3"), or None: CPU build, no libraries."""
    if not cuda_build():
        return None
    try:
        version = paddle_inference.get_trt_runtime_version()
    except RuntimeError:  # "TensorRT dynamic library is not found"
        return None
    return ".".join(map(str, version)) if any(version) else None


def tensorrt_compiled_version():
    version = paddle_inference.get_trt_compile_version() if cuda_build() else (0,)
    return ".".join(map(str, version)) if any(version) else None


def require_tensorrt(option):
    """ConfigError naming ``option`` unless a GPU and TensorRT's libraries are here."""
    require_gpu(option, "TensorRT engines run on GPUs")
    if tensorrt_version() is None:
        built = tensorrt_compiled_version()
        raise ConfigError(
            f"{option} needs TensorRT{' ' + built if built else ''}, which {build_name()} cannot "
            "load (add its lib folder to LD_LIBRARY_PATH; paddle-resnet-doctor says more)"
        )


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The instruction-set flags the CPU reports (empty where /proc/cpuinfo is missing)."""
    try:
        with open(cpuinfo) as handle:
            return frozenset(handle.read().split())
    except OSError:
        return frozenset()


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name ("" where /proc/cpuinfo is missing)."""
    try:
        with open(cpuinfo) as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_fallback_note():
    """One line for the GPU build running on the CPU (no usable GPU), else None."""
    if cuda_build() and not gpu_available():
        return f"note: {why_no_gpu()}: running on the CPU"
    return None


# Instruction-set extensions with int8 dot products; without them oneDNN's int8 kernels
# are slower than fp32.
INT8_CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_has_int8_dot_products(cpuinfo="/proc/cpuinfo"):
    return bool(cpu_flags(cpuinfo) & set(INT8_CPU_FLAGS))
