"""The backends that run an exported model, by name: the one table that ``--backend``, the
inference command and the export's verification read. A new backend is one module beside
this one and one row here; what reads the table asks the row, not the backend's name.
"""

import dataclasses
from typing import Callable, Tuple

from paddle_resnet.core import devices, optional
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.deploy import exported, pir_tensorrt, predictor
from paddle_resnet.deploy.onnx_runtime import OnnxClassifier
from paddle_resnet.deploy.openvino_runtime import OpenVinoClassifier

AUTO = "auto"
CPU_PRECISIONS = ("fp32", "bf16", "int8")  # those of Paddle Inference's and OpenVINO's CPU runs


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    device: str  # "cpu" or "gpu"
    precisions: Tuple[str, ...]
    available: Callable[[], bool]  # () -> whether this machine can run it
    # (model_dir, inference_config, input_shape, max_batch, quantized) -> classifier
    build: Callable
    # runs the model's own precision (fp32, or int8 where it carries scales), not --cpu-precision
    model_precision: bool = False
    # the InferenceConfig field of its precision flag (--cpu-precision, --trt-precision)
    precision_key: str = "cpu_precision"
    # reads an export from PIR through its model.onnx only (not its inference.json)
    reads_pir_through_onnx: bool = False
    # runs a PIR export in int8 (Paddle's int8 kernels come from oneDNN's passes, which
    # PIR programs do not get)
    int8_from_pir: bool = True


def _paddle(name):
    def build(model_dir, inference_config, input_shape, max_batch, quantized):
        pir_export = exported.is_pir_export(model_dir)
        if name == "trt" and pir_export:  # the engines go into the program itself
            model_dir = pir_tensorrt.converted_model(
                model_dir, inference_config, input_shape, max_batch, quantized
            )
            calls = pir_tensorrt.predictor_calls(inference_config)
        else:
            in_paddle = quantized and exported.quantized_in_paddle(model_dir)
            calls = predictor.predictor_settings(
                inference_config, name, input_shape, max_batch, in_paddle, pir_export
            )
        return predictor.Classifier(model_dir, calls, input_shape)

    return build


BACKENDS = {
    backend.name: backend
    for backend in (
        Backend(
            "trt",
            "gpu",
            ("FP32", "FP16", "INT8"),
            lambda: bool(devices.tensorrt_version()),
            _paddle("trt"),
            precision_key="trt_precision",
        ),
        Backend("gpu", "gpu", ("fp32",), devices.gpu_available, _paddle("gpu")),
        Backend("cpu", "cpu", CPU_PRECISIONS, lambda: True, _paddle("cpu"), int8_from_pir=False),
        Backend(
            "openvino",
            "cpu",
            CPU_PRECISIONS,
            lambda: optional.has_openvino,
            OpenVinoClassifier,
            reads_pir_through_onnx=True,
        ),
        Backend(
            "onnxruntime",
            "cpu",
            ("fp32", "int8"),
            lambda: optional.has_onnxruntime,
            lambda model_dir, inference_config, *_: OnnxClassifier(model_dir, inference_config),
            model_precision=True,
        ),
    )
}
CHOICES = (AUTO,) + tuple(BACKENDS)


def resolve(requested):
    """The Backend row of ``--backend requested``: ``auto`` becomes trt on GPU machines
    with TensorRT, gpu on those without, and cpu elsewhere."""
    if requested == AUTO:
        if not devices.gpu_available():
            return BACKENDS["cpu"]
        return BACKENDS["trt" if devices.tensorrt_version() else "gpu"]
    if requested not in BACKENDS:
        raise ConfigError(f"--backend {requested!r}: choose one of {', '.join(CHOICES)}")
    if requested == "trt":
        devices.require_tensorrt("--backend trt")
    if requested == "gpu":
        devices.require_gpu("--backend gpu", "use --backend cpu")
    return BACKENDS[requested]


def chosen(inference_config, info):
    """(Backend row, one line saying which and why, or None) for the export whose
    model.json is ``info``. ``auto`` on a CPU takes OpenVINO where the export's
    verification passed it in the precision asked: it ran bf16 at 1.0-2.9x and int8 at
    1.5-1.9x Paddle Inference's speed, fp32 at 1.1-1.3x (docs/measurements.md)."""
    requested = inference_config.backend
    if requested != AUTO or devices.gpu_available():
        return resolve(requested), None
    precision = inference_config.cpu_precision
    verified = {row["backend"] for row in info.get("verification", ())}
    if not optional.has_openvino:
        why = "OpenVINO is not installed (pip install -r requirements-tools.txt)"
    elif f"openvino {precision}" not in verified:
        why = (
            f"the export was not verified on OpenVINO in {precision} "
            "(export_model.py --verify-images N)"
        )
    else:
        return BACKENDS["openvino"], (
            f"backend auto: openvino {precision}, the export verified on it "
            "(--backend cpu for Paddle Inference)"
        )
    return BACKENDS["cpu"], f"backend auto: cpu {precision} (Paddle Inference): {why}"


def build_classifier(inference_config, max_batch):
    """(classifier, model.json content, backend row, the lines on what runs and why)."""
    exported.check_dir(inference_config.directory)
    info = exported.read_info(inference_config.directory)
    backend, why = chosen(inference_config, info)
    check_precision(backend, inference_config)
    quantized = bool(info.get("quantization"))
    classifier = backend.build(
        inference_config.directory, inference_config, info["input_shape"], max_batch, quantized
    )
    notes = [why] if why else []
    if hasattr(classifier, "describe"):
        notes.append(classifier.describe())
    return classifier, info, backend, notes


def precision_of(backend, inference_config):
    return getattr(inference_config, backend.precision_key)


def check_precision(backend, inference_config):
    """A precision flag ``backend`` does not take, refused in one line."""
    if backend.precision_key != "trt_precision" and inference_config.trt_precision != "FP32":
        raise ConfigError(
            f"--trt-precision {inference_config.trt_precision} needs --backend trt, "
            f"not {backend.name}"
        )
    precision = precision_of(backend, inference_config)
    if precision not in backend.precisions or (backend.model_precision and precision != "fp32"):
        runs = (
            "the model's own precision" if backend.model_precision else "/".join(backend.precisions)
        )
        raise ConfigError(
            f"--{backend.precision_key.replace('_', '-')} {precision}: --backend {backend.name} "
            f"runs {runs}"
        )
