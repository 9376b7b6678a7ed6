"""OpenVINO as the CPU backend of the exported model (``inference.py --backend openvino``).

OpenVINO reads the exported model itself: ``inference.pdmodel`` through its Paddle front
end, or for a quantized model the ``model.onnx`` beside it (written when missing), whose
quantize/dequantize pairs its ONNX front end turns into int8 FakeQuantize ops (its
Paddle front end refuses Paddle's per-channel ones). The converted model is cached in
the exported folder (``exported.openvino_model``).

Precisions (``--cpu-precision``):
- fp32 and bf16: OpenVINO's ``INFERENCE_PRECISION_HINT`` (on AMX CPUs OpenVINO picks bf16
  unless told f32, so fp32 is asked for explicitly); the precision that ran is read back;
- int8: the model's own scales (PTQ or QAT, recorded in model.json), so the accuracy a
  user measured is the accuracy they ship; a model without scales is quantized by NNCF
  on the DALI calibration images only when they are given, and the run says which.
Throughput and latency hints: batch 1 runs with the LATENCY hint (one stream), larger
batches with THROUGHPUT (OpenVINO's streams); ``--cpu-threads`` caps the threads.
"""

import numpy as np

from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.core.optional import require
from paddle_resnet.deploy import exported

HINTS = {"fp32": "f32", "bf16": "bf16"}


def _openvino():
    return require("openvino", "--backend openvino")


def capabilities(core):
    """The CPU's OpenVINO capabilities, e.g. {"FP32", "BF16", "INT8"}."""
    return set(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def compile_settings(inference_config, max_batch, quantized):
    """OpenVINO's CPU properties for ``inference_config`` (``--cpu-precision``,
    ``--cpu-threads``) and the largest batch; ``quantized``: the model has scales."""
    precision = inference_config.cpu_precision
    settings = {"PERFORMANCE_HINT": "LATENCY" if max_batch == 1 else "THROUGHPUT"}
    if inference_config.cpu_threads:
        settings["INFERENCE_NUM_THREADS"] = inference_config.cpu_threads
    # int8 runs its quantized convolutions in int8 and the rest in fp32, as the model's
    # scales were measured (QAT's simulation, PTQ's calibration) in fp32
    settings["INFERENCE_PRECISION_HINT"] = HINTS.get(precision, "f32")
    if precision == "int8" and not quantized:
        raise ConfigError(
            "--backend openvino --cpu-precision int8 needs a model with "
            "quantization scales (export it with --ptq-algo or --qat)"
        )
    return settings


class OpenVinoClassifier:
    """An OpenVINO compiled model: float images in, class probabilities out."""

    def __init__(self, model_dir, inference_config, input_shape, max_batch, quantized):
        ov = _openvino()
        core = ov.Core()
        wanted = inference_config.cpu_precision
        if wanted in ("bf16", "int8") and wanted.upper() not in capabilities(core):
            raise ConfigError(
                f"--backend openvino --cpu-precision {wanted}: OpenVINO finds no "
                f"{wanted} support on this CPU"
            )
        settings = compile_settings(inference_config, max_batch, quantized)
        model = exported.openvino_model(model_dir, core, ov)
        model.reshape([-1] + list(input_shape))
        self.compiled = self._compile(core, model, settings, model_dir)
        self.request = self.compiled.create_infer_request()
        if settings["PERFORMANCE_HINT"] == "THROUGHPUT":
            # A batch smaller than the streams runs on one stream's cores: batches that
            # small get a model compiled for latency, which uses every core.
            latency = self._compile(
                core, model, dict(settings, PERFORMANCE_HINT="LATENCY"), model_dir
            )
            self.request = latency.create_infer_request()
        # The throughput hint gives OpenVINO several streams: a batch is split over them
        # (one asynchronous request each), as OpenVINO's own benchmark_app runs them.
        self.streams = int(self.compiled.get_property("NUM_STREAMS"))
        self.queue = ov.AsyncInferQueue(self.compiled, self.streams) if self.streams > 1 else None
        self.input_shape = tuple(input_shape)
        self.settings = settings

    @staticmethod
    def _compile(core, model, settings, model_dir):
        try:
            return core.compile_model(model, "CPU", settings)
        except RuntimeError as err:
            raise UserError(
                f"{model_dir}: OpenVINO cannot compile the model "
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
            f"{self.settings['PERFORMANCE_HINT'].lower()} hint, {self.streams} stream(s)"
        )

    def int8_layers(self):
        """How many layers of the executed graph compute in int8 (u8/i8 inputs)."""
        runtime = self.compiled.get_runtime_model()
        count = 0
        for op in runtime.get_ordered_ops():
            info = op.get_rt_info()
            if "runtimePrecision" not in info or "layerType" not in info:
                continue
            precision, layer = info["runtimePrecision"].astype(str), info["layerType"].astype(str)
            if precision in ("u8", "i8") and layer in ("Convolution", "FullyConnected"):
                count += 1
        return count

    def __call__(self, images):
        images = exported.checked_batch(images, self.input_shape)
        if self.queue is None or len(images) < self.streams:
            result = self.request.infer({0: images})
            return np.array(next(iter(result.values())))
        chunks = np.array_split(images, self.streams)
        outputs = [None] * len(chunks)

        def keep(request, index):
            outputs[index] = np.array(request.get_output_tensor(0).data)

        self.queue.set_callback(keep)
        for index, chunk in enumerate(chunks):
            self.queue.start_async({0: np.ascontiguousarray(chunk)}, index)
        self.queue.wait_all()
        return np.concatenate(outputs)
