"""A preflight before a long job: what this machine and its Paddle can run, and what
each finding means for the toolkit's options. The doctor (``commands/doctor.py``)
prints them and checks its ``--require`` list (``REQUIREMENTS``) against them.
"""

import os
from dataclasses import dataclass
from typing import Optional

import nvidia.dali as dali
import nvidia.dali.backend as dali_backend
import paddle

from paddle_resnet.core import devices, optional, paddle_internals
from paddle_resnet.core.errors import UserError

# The CPU's instruction-set extensions that decide its kernels, and what each gives.
CPU_EXTENSIONS = (
    ("avx512f", "AVX-512"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512_bf16", "AVX-512 BF16"),
    ("amx_bf16", "AMX-BF16"),
    ("amx_int8", "AMX-INT8"),
)


@dataclass(frozen=True)
class Finding:
    """A finding and what it means; ``provides``: the requirement it meets if ``met``."""

    topic: str
    found: str
    meaning: str
    provides: Optional[str] = None
    met: bool = True


def paddle_findings():
    build = "GPU" if devices.cuda_build() else "CPU"
    yield Finding(
        "Paddle",
        f"{build} build, {devices.build_name()}",
        "fp16 AMP, TensorRT and NCCL where a GPU is usable"
        if build == "GPU"
        else "training and inference on the CPU only (paddlepaddle-gpu for GPUs)",
    )
    if not devices.cuda_build():
        return
    yield Finding(
        "CUDA / cuDNN",
        f"built for CUDA {paddle.version.cuda()}, cuDNN {paddle.version.cudnn()}",
        "the system needs a driver for this CUDA and these cuDNN libraries",
    )


def gpu_findings():
    count = devices.gpu_count()
    if not count:
        yield Finding(
            "GPUs",
            "none usable",
            f"{devices.why_no_gpu()}: --amp, --use-pure-fp16, --sync-bn and the gpu/trt backends "
            "are refused; everything runs on the CPU",
            provides="gpu",
            met=False,
        )
    for gpu in range(count):
        major, minor = paddle.device.cuda.get_device_capability(gpu)
        kinds = ["fp16 tensor cores" if major >= 7 else "no tensor cores: AMP gains little"]
        if major >= 8:
            kinds.append("2:4 sparse tensor cores (ASP pays off in TensorRT)")
        yield Finding(
            f"GPU {gpu}",
            f"{paddle.device.cuda.get_device_name(gpu)}, compute capability {major}.{minor}",
            "; ".join(kinds),
            provides="gpu",
        )
    if not devices.cuda_build():
        return
    try:
        nccl = paddle_internals.nccl_version()
    except RuntimeError:  # Paddle's "dynamic library not found"
        nccl = None
    yield Finding(
        "NCCL",
        f"version {nccl}" if nccl else "not loadable",
        "multi-GPU data parallelism"
        if nccl and count
        else "no multi-GPU data parallelism"
        + ("" if nccl else " (libnccl not on the library path)"),
        provides="nccl",
        met=bool(nccl) and count > 0,
    )


def tensorrt_findings():
    if not devices.cuda_build():
        return
    found, built = devices.tensorrt_version(), devices.tensorrt_compiled_version()
    usable = bool(found) and devices.gpu_available()
    yield Finding(
        "TensorRT",
        f"{found or 'not loadable'} (Paddle built against {built})",
        "--backend trt available (auto picks it)"
        if usable
        else "no TensorRT: --backend trt unavailable (auto picks gpu where a GPU is usable)",
        provides="trt",
        met=usable,
    )


def dali_findings():
    gpus = dali_backend.GetCUDADeviceCount()
    yield Finding(
        "DALI",
        f"{dali.__version__}, sees {gpus} GPU(s)",
        "JPEG decoding on the GPU (nvJPEG, device 'mixed')"
        if gpus
        else "JPEG decoding on the CPU (no GPU decoding)",
        provides="dali-gpu",
        met=gpus > 0,
    )


def cpu_findings(cpuinfo="/proc/cpuinfo"):
    flags = devices.cpu_flags(cpuinfo)
    present = [name for flag, name in CPU_EXTENSIONS if flag in flags]
    yield Finding(
        "CPU",
        f"{len(os.sched_getaffinity(0))} cores, "
        f"{', '.join(present) or 'none of AVX-512 / VNNI / AMX'}",
        "oneDNN kernels for CPU training and inference",
    )
    bf16 = paddle_internals.supports_bf16()
    yield Finding(
        "bf16 (CPU)",
        "yes" if bf16 else "no",
        "--cpu-precision bf16 available; --amp --amp-dtype bfloat16 trains (PIR)"
        if bf16
        else "--cpu-precision bf16 refused",
        provides="bf16",
        met=bf16,
    )
    int8 = bool(flags & set(devices.INT8_CPU_FLAGS))
    yield Finding(
        "int8 (CPU)",
        "yes" if int8 else "no int8 dot products",
        "--cpu-precision int8 available"
        if int8
        else "--cpu-precision int8 refused (oneDNN int8 would be slower than fp32)",
        provides="int8",
        met=int8,
    )


def package_findings():
    onnx = optional.has_paddle2onnx and optional.has_onnxruntime
    yield Finding(
        "ONNX",
        "paddle2onnx and onnxruntime installed" if onnx else "not installed",
        "export_model.py --onnx available"
        if onnx
        else "export_model.py --onnx refused (pip install -r requirements-tools.txt)",
        provides="onnx",
        met=onnx,
    )


def findings(graph_findings=(), cpuinfo="/proc/cpuinfo"):
    """Every finding, in the table's order; ``graph_findings`` are those of the static
    graphs the builders make, which only training/ knows (``training/graph_apis.py``)."""
    return [
        *paddle_findings(),
        *graph_findings,
        *gpu_findings(),
        *tensorrt_findings(),
        *dali_findings(),
        *cpu_findings(cpuinfo),
        *package_findings(),
    ]


REQUIREMENTS = ("gpu", "trt", "nccl", "dali-gpu", "bf16", "int8", "onnx", "legacy", "pir")


def unmet(found, required):
    """The requirements of ``required`` that no finding meets, with the reason."""
    missing = []
    for name in required:
        relevant = [f for f in found if f.provides == name]
        if not relevant:
            missing.append(f"{name}: not in this Paddle build ({devices.build_name()})")
        elif not any(f.met for f in relevant):
            missing.append(f"{name}: {relevant[0].meaning}")
    return missing


def table(found):
    width = max(len(f.topic) for f in found)
    return "\n".join(f"{f.topic:<{width}}  {f.found}\n{'':<{width}}  -> {f.meaning}" for f in found)


def parse_requirements(text):
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in REQUIREMENTS]
    if unknown:
        raise UserError(
            f"--require: unknown requirement {unknown[0]!r}; known: {', '.join(REQUIREMENTS)}"
        )
    return names
