"""Optional packages: the tools that need them (ONNX export and benchmarks, plots, weight
import) are not needed to train. ``has_<name>`` says whether one is installed, without
importing it; ``require`` imports it or stops with a one-line error naming the install."""

import importlib
import importlib.metadata
import importlib.util

from paddle_resnet.core.errors import UserError

# module -> pip requirement that provides it (requirements-tools.txt pins them): the
# module's own name but for scikit-learn's and grpcio's
_SAME_NAME = """onnxruntime paddle2onnx onnx matplotlib visualdl tensorboardX mlflow torch
    safetensors openvino nncf kserve fastapi""".split()
PACKAGES = dict(zip(_SAME_NAME, _SAME_NAME), sklearn="scikit-learn", grpc="grpcio")
PACKAGES.update(timing_asgi="timing-asgi", uvloop="uvloop")  # KServe's own dependencies
# how to install a package when not by requirements-tools.txt: nncf's numpy 2 would
# replace the numpy 1.26 Paddle 2.6 needs, so it goes into a folder of its own
# KServe 0.21 needs protobuf >= 6.33, Paddle 2.6 protobuf 4: the server has an environment of
# its own (Paddle 3.3.1, no DALI)
_SERVE = "bash scripts/setup_serve.sh (.venv-serve)"
INSTALL = {"nncf": "scripts/setup_nncf.sh"}
INSTALL.update(dict.fromkeys(("kserve", "fastapi", "grpc", "timing_asgi", "uvloop"), _SERVE))
DEFAULT_INSTALL = "pip install -r requirements-tools.txt"


def _installed(module):
    return importlib.util.find_spec(module) is not None


has_onnxruntime = _installed("onnxruntime")
has_paddle2onnx = _installed("paddle2onnx")
has_openvino = _installed("openvino")
has_kserve = _installed("kserve")
# paddle2onnx 1.x (Paddle 2.6) reads no PIR inference.json; 2.x (Paddle 3) converts no
# int8 model (deploy/onnx_export.check_converter)
paddle2onnx_major = (
    int(importlib.metadata.version("paddle2onnx").split(".")[0]) if has_paddle2onnx else None
)
has_int8_onnx = paddle2onnx_major == 1


# tracker -> (the modules it needs, the pip command that installs them); the confusion
# image is drawn with matplotlib (core/trackers/; --tracker's check: core/config/run.py)
TRACKERS = {
    "tensorboard": (
        ("tensorboardX", "matplotlib"),
        "pip install tensorboardX tensorboard matplotlib",
    ),
    "mlflow": (("mlflow", "matplotlib"), "pip install mlflow matplotlib"),
    "visualdl": (("visualdl", "matplotlib"), "pip install visualdl matplotlib"),
}


def tracker_unusable(name):
    """The check of ``--tracker``: why tracker ``name`` cannot run here (and the fix), or None."""
    if name not in TRACKERS:
        return f"must be one of {', '.join(TRACKERS)}, got {name!r}"
    modules, install = TRACKERS[name]
    missing = [PACKAGES[module] for module in modules if not _installed(module)]
    if not missing:
        return None
    plural = "s" if len(missing) > 1 else ""
    return f"{name} needs the optional package{plural} {' and '.join(missing)}: {install}"


def not_installed(package, purpose):
    return UserError(
        f"{purpose} needs the optional package {PACKAGES[package]}: "
        f"{INSTALL.get(package, DEFAULT_INSTALL)}"
    )


def require(module, purpose):
    """``module`` imported, or a UserError saying that ``purpose`` needs it and how to install it."""
    package = module.split(".")[0]
    if not _installed(package):
        raise not_installed(package, purpose)
    try:
        return importlib.import_module(module)
    except ImportError as err:  # installed but broken: a missing dependency of its own
        raise UserError(
            f"{purpose} needs {module}, which is installed but does not import ({err}): "
            f"{INSTALL.get(package, DEFAULT_INSTALL)}"
        ) from None
