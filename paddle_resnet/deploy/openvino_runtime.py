"""OpenVINO as the CPU backend of the exported model (``inference.py --backend openvino``).

OpenVINO reads the exported model itself (``openvino_conversion.openvino_model``).
Precisions (``--cpu-precision``): fp32 and bf16 by OpenVINO's ``INFERENCE_PRECISION_HINT``
(on AMX CPUs OpenVINO picks bf16 unless told f32, so fp32 is asked for explicitly); int8
by the model's own scales (PTQ or QAT), so the accuracy a user measured is the accuracy
they ship. One static-shape model is compiled (and kept) for each batch size a run calls
with, under the LATENCY hint (one stream on every thread): measured up to 1.25x faster
than a dynamic batch split over THROUGHPUT's streams (ResNet-50, bf16, batch 32).
"""

from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.core.optional import require
from paddle_resnet.deploy.classifier_input import checked_batch
from paddle_resnet.deploy.openvino_conversion import openvino_model

HINTS = {"fp32": "f32", "bf16": "bf16"}


def _openvino():
    return require("openvino", "--backend openvino")


def capabilities(core):
    """The CPU's OpenVINO capabilities, e.g. {"FP32", "BF16", "INT8"}."""
    return set(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def compile_settings(inference_config, quantized):
    """OpenVINO's CPU properties for ``inference_config``; ``quantized``: the model has scales."""
    precision = inference_config.cpu_precision
    if precision == "int8" and not quantized:
        raise ConfigError(
            "--backend openvino --cpu-precision int8 needs a model with "
            "quantization scales (export it with --ptq-algo or --qat)"
        )
    return {
        # a batch runs as one request on a model compiled for its size: one stream with
        # every thread runs it fastest (THROUGHPUT's streams would each get a share)
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": inference_config.cpu_threads or available_cores(),
        # int8 runs its quantized convolutions in int8 and the rest in fp32, as the
        # model's scales were measured (QAT's simulation, PTQ's calibration) in fp32
        "INFERENCE_PRECISION_HINT": HINTS.get(precision, "f32"),
    }


def compile_for_batch(core, model, image_shape, batch_size, settings):
    """``model`` compiled for batches of exactly ``batch_size`` images of ``image_shape``."""
    static = model.clone()  # ``model`` keeps its dynamic batch for the next size
    static.reshape([batch_size, *image_shape])
    return core.compile_model(static, "CPU", settings)


class PerBatchSize:
    """Runs a batch on a model compiled for its size on its first batch, and kept."""

    def __init__(self, compile_batch):
        self.compile_batch = compile_batch
        self.requests = {}

    def request_for(self, batch_size):
        if batch_size not in self.requests:
            self.requests[batch_size] = self.compile_batch(batch_size).create_infer_request()
        return self.requests[batch_size]

    def compiled_models(self):
        """Batch size -> its compiled model, for those compiled so far."""
        return {size: request.get_compiled_model() for size, request in self.requests.items()}

    def __call__(self, images):
        return self.request_for(len(images)).infer({0: images})[0]  # a copy, not the request's


def layer_precisions(compiled):
    """How many convolution and matmul layers OpenVINO ran in each precision."""
    counts = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "runtimePrecision" not in info or "layerType" not in info:
            continue
        if info["layerType"].astype(str) in ("Convolution", "FullyConnected"):
            precision = info["runtimePrecision"].astype(str)
            counts[precision] = counts.get(precision, 0) + 1
    return counts


class OpenVinoClassifier:
    """OpenVINO compiled models: float images in, class probabilities out."""

    def __init__(self, model_dir, inference_config, input_shape, max_batch, quantized):
        ov = _openvino()
        core = ov.Core()
        wanted = inference_config.cpu_precision
        if wanted in ("bf16", "int8") and wanted.upper() not in capabilities(core):
            raise ConfigError(
                f"--backend openvino --cpu-precision {wanted}: OpenVINO finds no "
                f"{wanted} support on this CPU"
            )
        self.settings = compile_settings(inference_config, quantized)
        self.model_dir = model_dir
        self.input_shape = tuple(input_shape)
        model = openvino_model(model_dir, core, ov)
        self.per_batch = PerBatchSize(lambda batch_size: self._compile(core, model, batch_size))
        # compiled now for the largest batch: a model OpenVINO cannot compile fails here,
        # and describe() reads what runs from it
        self.compiled = self.per_batch.request_for(max_batch).get_compiled_model()

    def _compile(self, core, model, batch_size):
        try:
            return compile_for_batch(core, model, self.input_shape, batch_size, self.settings)
        except RuntimeError as err:
            raise UserError(
                f"{self.model_dir}: OpenVINO cannot compile the model "
                f"({str(err).strip().splitlines()[-1]})"
            ) from None

    def ran_precision(self):
        """The precision OpenVINO chose for the floating-point work."""
        return self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # "f32", "bf16"

    def describe(self):
        """One line: what ran, as OpenVINO reports it."""
        return (
            f"openvino {_openvino().__version__.split('-')[0]}: floating point in "
            f"{self.ran_precision()}, {self.int8_layers()} int8 convolution/matmul layers, "
            f"{self.settings['PERFORMANCE_HINT'].lower()} hint, "
            f"{self.compiled.get_property('NUM_STREAMS')} stream(s) of "
            f"{self.compiled.get_property('INFERENCE_NUM_THREADS')} threads, "
            "a static-shape model per batch size"
        )

    def int8_layers(self):
        """How many layers of the executed graph compute in int8 (u8/i8 inputs)."""
        precisions = layer_precisions(self.compiled)
        return precisions.get("u8", 0) + precisions.get("i8", 0)

    def __call__(self, images):
        return self.per_batch(checked_batch(images, self.input_shape))
