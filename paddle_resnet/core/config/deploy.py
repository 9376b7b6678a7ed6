"""The deployment sections: Paddle Inference (export, inference.py) and serving."""

from dataclasses import dataclass
from typing import Optional, Tuple

from paddle_resnet.core.config.keys import (
    CPU_PRECISIONS,
    DEFAULT_INFERENCE_DIR,
    EXPORT,
    EXPORT_INFERENCE,
    INFERENCE,
    INFERENCE_MODES,
    MODEL_TOOLS,
    PTQ_ALGOS,
    SERVE,
    TRT_PRECISIONS,
    at_least,
    each,
    in_range,
    key,
    nonempty,
    positive,
)


@dataclass(frozen=True)
class InferenceConfig:
    model_dir: Optional[str] = key(
        None,
        "--inference-dir",
        "inference model folder: export_model.py writes it, inference.py reads it (default "
        f"{DEFAULT_INFERENCE_DIR}); train.py exports the final model there when given",
        aliases=("--trt-inference-dir",),
        tools=MODEL_TOOLS + SERVE,
    )
    backend: str = key(
        "auto",
        "--backend",
        "predictor backend, a name in deploy/backends.py (auto: trt on GPU machines; on "
        "CPUs openvino where it is installed and the export was verified on it "
        "(export_model.py --verify-images), cpu otherwise; cpu is Paddle Inference with "
        "oneDNN; openvino and onnxruntime need pip install openvino / onnxruntime)",
        tools=INFERENCE + SERVE,
    )
    mode: str = key(
        "benchmark", "--mode", "what inference.py does", choices=INFERENCE_MODES, tools=INFERENCE
    )
    images: Tuple[str, ...] = key(
        (), "--images", "predict: comma-separated image files or folders", tools=INFERENCE
    )
    batch_sizes: Tuple[int, ...] = key(
        (1, 32),
        "--benchmark-batch-sizes",
        "benchmark: comma-separated batch sizes",
        lambda v: nonempty(v) or each(at_least(1))(v),
        tools=INFERENCE,
    )
    device_id: int = key(
        0, "--device", "GPU of the gpu and trt backends", at_least(0), tools=INFERENCE
    )
    trt_precision: str = key(
        "FP32",
        "--trt-precision",
        "TensorRT precision",
        choices=TRT_PRECISIONS,
        aliases=("--precision",),
        tools=INFERENCE,
    )
    trt_workspace_size: int = key(
        1024,
        "--trt-workspace-size",
        "TensorRT workspace in MB (a value of 2^20 or more is taken as bytes, as NVIDIA's scripts "
        "pass it)",
        at_least(1),
        aliases=("--workspace-size",),
        tools=INFERENCE,
    )
    trt_min_subgraph_size: int = key(
        3,
        "--trt-min-subgraph-size",
        "smallest subgraph handed to TensorRT",
        at_least(1),
        aliases=("--min-subgraph-size",),
        tools=INFERENCE,
    )
    trt_use_static: bool = key(
        False,
        "--trt-use-static",
        "serialize TensorRT engines for reuse",
        aliases=("--use-static",),
        tools=INFERENCE,
    )
    trt_use_calib_mode: bool = key(
        False,
        "--trt-use-calib-mode",
        "INT8: calibrate on validation images (post-training quantization)",
        aliases=("--use-calib-mode",),
        tools=INFERENCE,
    )
    use_synthetic: bool = key(
        False,
        "--use-synthetic",
        "benchmark on synthetic input",
        deprecated=("--trt-use-synthat",),
        tools=INFERENCE,
    )
    cpu_precision: str = key(
        "fp32",
        "--cpu-precision",
        "CPU precision of the cpu and openvino backends",
        choices=CPU_PRECISIONS,
        tools=EXPORT_INFERENCE + SERVE,
    )
    cpu_threads: int = key(
        0,
        "--cpu-threads",
        "CPU math threads (0: all cores)",
        at_least(0),
        tools=EXPORT_INFERENCE + SERVE,
    )
    ptq_algo: Optional[str] = key(
        None,
        "--ptq-algo",
        "export_model.py: quantize the exported model to INT8 after training (post-training "
        "quantization), calibrating activation ranges with this algorithm",
        choices=PTQ_ALGOS,
        tools=EXPORT,
    )
    onnx: bool = key(
        False,
        "--onnx",
        "export_model.py: also write model.onnx (paddle2onnx, "
        "opset 13) beside the Paddle model, fp32 or quantized",
        tools=EXPORT,
    )
    openvino: bool = key(
        False,
        "--openvino",
        "export_model.py: also write OpenVINO's model (openvino/model.xml, what --backend openvino "
        "reads; pip install openvino)",
        tools=EXPORT,
    )
    verify_images: int = key(
        0,
        "--verify-images",
        "export_model.py: run the export on this many validation images through every backend and "
        "precision this machine has, against the fp32 Paddle predictor; fail on disagreement (0: "
        "no check)",
        at_least(0),
        tools=EXPORT,
    )
    calibration_images: int = key(
        512,
        "--calibration-images",
        "export_model.py --ptq-algo: training images (validation preprocessing) to calibrate on",
        at_least(1),
        tools=EXPORT,
    )
    log_path: str = key(
        "./inference.json",
        "--inference-log-path",
        "JSON-lines inference report",
        aliases=("--trt-log-path",),
        tools=INFERENCE,
    )
    export_log_path: str = key(
        "./export.json",
        "--export-log-path",
        "JSON export report",
        aliases=("--trt-export-log-path",),
        tools=EXPORT,
    )

    @property
    def directory(self):
        return self.model_dir or DEFAULT_INFERENCE_DIR


# --max-image-pixels' default, per pixel of the export's input: a 20 M px photo for a 224 px
# model (a decode of 60 MB), a 640 x 640 image for a 32 px one
IMAGE_PIXELS_PER_INPUT_PIXEL = 400


@dataclass(frozen=True)
class ServeConfig:
    model_name: Optional[str] = key(
        None,
        "--model-name",
        "the model's name on the endpoints (/v2/models/NAME); default: the export folder's name",
        tools=SERVE,
    )
    host: str = key(
        "0.0.0.0",
        "--host",
        "the address the REST and gRPC ports listen on; the default is KServe's own, every "
        "interface (gRPC on [::]); 127.0.0.1: this machine only",
        tools=SERVE,
    )
    http_port: int = key(
        8080, "--http-port", "REST port", in_range(1, 65536, "[1, 65535]"), tools=SERVE
    )
    grpc_port: int = key(
        8081, "--grpc-port", "gRPC port", in_range(1, 65536, "[1, 65535]"), tools=SERVE
    )
    max_batch: int = key(
        32,
        "--max-batch",
        "largest batch run at once: requests that arrive together run as one batch of at "
        "most this many images; a request may hold at most this many",
        at_least(1),
        tools=SERVE,
    )
    max_wait_ms: float = key(
        2.0,
        "--max-wait-ms",
        "under load, how long the first request of a batch waits for others to join it "
        "(milliseconds; a request alone runs at once)",
        at_least(0),
        tools=SERVE,
    )
    max_request_mb: float = key(
        64.0,
        "--max-request-mb",
        "largest request: a REST body (with a Content-Length or streamed in chunks) or gRPC "
        "message above it is refused (413, RESOURCE_EXHAUSTED)",
        positive,
        tools=SERVE,
    )
    max_image_pixels: Optional[int] = key(
        None,
        "--max-image-pixels",
        "largest encoded image decoded, in pixels (width x height, read from its header "
        "before decoding): a larger one is refused (400, INVALID_ARGUMENT); default: "
        f"{IMAGE_PIXELS_PER_INPUT_PIXEL} times the export's input (20.1 M px at 224 x 224)",
        at_least(1),
        tools=SERVE,
    )
