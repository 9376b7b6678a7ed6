"""A preflight before a long job: what this machine and its Paddle can run, and what
each finding means for the toolkit's options.

    python -m paddle_resnet.core.doctor                      # the findings, one table
    python -m paddle_resnet.core.doctor --require gpu,trt    # exit 1 unless both are here
    python -m paddle_resnet.core.doctor --json               # the same findings as JSON

Requirements (``--require``): gpu, trt, nccl, dali-gpu, bf16, int8, onnx, legacy, pir
(the IRs whose programs build on this Paddle). Exit status 0
when every one is met, 1 when one is not (a line each names it and why), 2 for a
requirement name it does not know.
"""

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Optional

import nvidia.dali as dali
import nvidia.dali.backend as dali_backend
import paddle

from paddle_resnet.core import devices, optional, paddle_internals

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
    """One line of the report: what was found, and what it means for the options.
    ``provides`` names the requirement it meets (``--require``), if any; ``met`` says
    whether it does."""

    topic: str
    found: str
    meaning: str
    provides: Optional[str] = None
    met: bool = True


def _version(getter):
    """A version from ``getter``, or None where the library behind it cannot be loaded."""
    try:
        version = getter()
    except RuntimeError:  # Paddle's "dynamic library not found"
        return None
    return version or None


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
            f"{devices.why_no_gpu()}: --amp, --use-pure-fp16, "
            "--sync-bn and the gpu/trt backends are refused; everything runs on the "
            "CPU",
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
    nccl = _version(paddle_internals.nccl_version)
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


# The Paddle APIs the toolkit's program builders call (training/programs.py, the
# models, pir_strategies.py), each as a tiny static graph over an image batch ``x`` and
# its labels ``y``: a Paddle that moves one of them out of reach of an IR (APIs moved to
# C++ bindings take no legacy variable) is named before a long job starts.
GRAPH_APIS = {
    "paddle.static.data": lambda x, y: x,
    "paddle.nn.Conv2D": lambda x, y: paddle.nn.Conv2D(3, 4, 3, padding=1)(x),
    "paddle.nn.BatchNorm2D": lambda x, y: paddle.nn.BatchNorm2D(3)(x),
    "paddle.nn.ReLU": lambda x, y: paddle.nn.ReLU()(x),
    "paddle.nn.MaxPool2D": lambda x, y: paddle.nn.MaxPool2D(2)(x),
    "paddle.nn.AdaptiveAvgPool2D": lambda x, y: paddle.nn.AdaptiveAvgPool2D(1)(x),
    "paddle.flatten": lambda x, y: paddle.flatten(x, 1),
    "paddle.nn.Linear": lambda x, y: paddle.nn.Linear(48, 4)(paddle.flatten(x, 1)),
    "paddle.cast": lambda x, y: paddle.cast(x, "float32"),
    "paddle.flip": lambda x, y: paddle.flip(x, [0]),
    "paddle.reshape": lambda x, y: paddle.reshape(x, [-1, 48]),
    "paddle.nn.functional.one_hot": lambda x, y: paddle.nn.functional.one_hot(y, 4),
    "paddle.nn.functional.label_smooth": lambda x, y: paddle.nn.functional.label_smooth(
        paddle.reshape(paddle.nn.functional.one_hot(y, 4), [-1, 4]), epsilon=0.1
    ),
    "paddle.nn.functional.cross_entropy": lambda x, y: paddle.nn.functional.cross_entropy(
        paddle.reshape(x, [-1, 48])[:, :4], y
    ),
    "paddle.nn.functional.softmax": lambda x, y: paddle.nn.functional.softmax(x),
    "paddle.topk": lambda x, y: paddle.topk(paddle.reshape(x, [-1, 48]), k=2)[1],
    "paddle.mean": lambda x, y: paddle.mean(x),
    "paddle.metric.accuracy": lambda x, y: paddle.metric.accuracy(
        input=paddle.reshape(x, [-1, 48]), label=y, k=1
    ),
    "paddle.assign": lambda x, y: paddle.assign(x * 2.0, output=x),
}


def _mixed_precision_step(x, y):
    """PIR's AMP as the builders use it (pir_strategies.py), in bf16: fp16 builds on GPU
    builds only."""
    conv, optimizer = paddle.amp.decorate(
        models=paddle.nn.Conv2D(3, 4, 1),
        optimizers=paddle.optimizer.Momentum(0.1),
        level="O1",
        dtype="bfloat16",
    )
    with paddle.amp.auto_cast(level="O1", dtype="bfloat16"):
        out = conv(x)
    scaler = paddle.amp.GradScaler(init_loss_scaling=2.0, use_dynamic_loss_scaling=False)
    scaler.minimize(optimizer, paddle.mean(out.astype("float32")) * 2.0)


# Built on PIR only (on the legacy IR Fleet's AMP rewrites the built program instead).
PIR_GRAPH_APIS = {"paddle.amp (auto_cast, decorate, GradScaler)": _mixed_precision_step}
# The newest Paddle on which every one of them built, per IR (this project's CI).
LAST_KNOWN_GOOD = {"legacy": "3.3.1", "pir": "3.3.1"}


def graph_apis(ir):
    return dict(GRAPH_APIS, **(PIR_GRAPH_APIS if ir == "pir" else {}))


def graph_api_failures(ir):
    """{API: its error} of the GRAPH_APIS (and on PIR the PIR_GRAPH_APIS) that do not
    build on ``ir`` ("legacy", "pir")."""
    failures = {}
    guard = paddle_internals.static_ir(ir == "pir")
    with guard:
        paddle.enable_static()
        for name, build in graph_apis(ir).items():
            main, startup = paddle.static.Program(), paddle.static.Program()
            try:
                with paddle.static.program_guard(main, startup):
                    x = paddle.static.data("x", [None, 3, 4, 4], "float32")
                    y = paddle.static.data("y", [None, 1], "int64")
                    build(x, y)
            except Exception as err:  # any refusal names the API
                failures[name] = str(err).strip().splitlines()[-1][:160]
    return failures


def graph_findings():
    for ir in ("legacy", "pir") if paddle_internals.PADDLE3 else ("legacy",):
        failures = graph_api_failures(ir)
        if failures:
            name, error = next(iter(failures.items()))
            found = f"{len(failures)} of {len(graph_apis(ir))} APIs fail, first {name}: {error}"
            meaning = (
                f"--ir {ir} cannot build the toolkit's programs on this Paddle "
                f"(last known good: {LAST_KNOWN_GOOD[ir]})"
            )
        else:
            found = f"the {len(graph_apis(ir))} Paddle APIs the builders use build"
            meaning = f"--ir {ir} programs can be built"
        yield Finding(f"static graph ({ir} IR)", found, meaning, provides=ir, met=not failures)


def findings(cpuinfo="/proc/cpuinfo"):
    return [
        *paddle_findings(),
        *graph_findings(),
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
        if not any(f.met for f in relevant):
            reason = (
                relevant[0].meaning
                if relevant
                else f"not in this Paddle build ({devices.build_name()})"
            )
            missing.append(f"{name}: {reason}")
    return missing


def table(found):
    width = max(len(f.topic) for f in found)
    return "\n".join(f"{f.topic:<{width}}  {f.found}\n{'':<{width}}  -> {f.meaning}" for f in found)


def parse_requirements(text):
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in REQUIREMENTS]
    if unknown:
        raise ValueError(
            f"--require: unknown requirement {unknown[0]!r}; known: {', '.join(REQUIREMENTS)}"
        )
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m paddle_resnet.core.doctor",
        description=__doc__.splitlines()[0],
        allow_abbrev=False,
    )
    parser.add_argument(
        "--require",
        default="",
        metavar="NAMES",
        help=f"comma-separated, of: {', '.join(REQUIREMENTS)}; exit 1 unless all are met",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    try:
        required = parse_requirements(args.require)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = findings()
    missing = unmet(found, required)
    if args.json:
        print(
            json.dumps(
                {"findings": [asdict(f) for f in found], "required": required, "unmet": missing},
                indent=1,
            )
        )
    else:
        print(table(found))
    for line in missing:
        print(f"error: required {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
