"""The exported model as OpenVINO reads it, converted once and kept in the exported
folder (``<dir>/openvino/``) for the next run: by export (``--openvino``) or by the
OpenVINO backend on first use."""

import contextlib
import os

from paddle_resnet.core.atomic import staged_directory
from paddle_resnet.deploy import exported
from paddle_resnet.deploy.onnx_export import write_onnx


def openvino_model(model_dir, core, ov):
    """The exported model as OpenVINO reads it: converted once, then read from
    ``<dir>/openvino/model.xml`` while that is newer than its source: inference.pdmodel, or
    model.onnx (written if missing) for a quantized model and for a PIR export: OpenVINO
    2026.4's Paddle reader refuses Paddle's per-channel quantize/dequantize ops
    ("quant_axis is NOT in the range of [-1]") and reads no .json."""
    cached = os.path.join(model_dir, exported.OPENVINO_DIR, exported.OPENVINO_FILE)
    source = os.path.join(model_dir, exported.MODEL_FILE)
    if exported.read_info(model_dir).get("quantization") or exported.is_pir_export(model_dir):
        source = os.path.join(model_dir, exported.ONNX_FILE)
        if not os.path.exists(source):
            write_onnx(model_dir)
    if os.path.exists(cached) and os.path.getmtime(cached) >= os.path.getmtime(source):
        return core.read_model(cached)
    model = core.read_model(source)
    with contextlib.suppress(OSError):  # read-only: convert each time
        with staged_directory(os.path.dirname(cached)) as staging:
            ov.save_model(
                model, os.path.join(staging, exported.OPENVINO_FILE), compress_to_fp16=False
            )
    return model
