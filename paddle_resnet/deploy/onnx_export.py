"""An exported folder's model.onnx (``export_model.py --onnx``; the source OpenVINO reads
for quantized and PIR exports): paddle2onnx's conversion of the Paddle model, with the
toolkit's int8 rewrites (``onnx_int8``) where the model is quantized, and the check,
before any work, that the installed paddle2onnx can convert it."""

import os

from paddle_resnet.core import bootstrap, optional
from paddle_resnet.core.bootstrap import native_chatter, paddle_chatter
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.optional import require
from paddle_resnet.deploy import exported, onnx_int8, pir_int8
from paddle_resnet.deploy.legacy_int8 import matmul_input_ranges


def check_converter(model_dir, quantized, pir):
    """UserError when the installed paddle2onnx cannot convert this model: 1.x reads no
    PIR inference.json; 2.x converts Paddle's int8 quantize/dequantize ops as float8 only
    (it aborts the process: "Only support e4m3 or e5m2 now")."""
    if not (quantized or pir):
        return
    version = require("paddle2onnx", "--onnx").__version__
    if pir and optional.paddle2onnx_major < 2:
        raise UserError(
            f"{model_dir}: model.onnx from a PIR export (inference.json) needs paddle2onnx "
            f"2.x on Paddle 3; this environment has {version}, which reads "
            "inference.pdmodel only (export with --ir legacy)"
        )
    if quantized and not pir and not optional.has_int8_onnx:
        raise UserError(
            f"{model_dir}: an int8 legacy-IR model to ONNX (--onnx, OpenVINO int8) needs "
            f"paddle2onnx 1.2.11 (Paddle 2.6); paddle2onnx {version} converts Paddle's "
            "quantize ops as float8 only: export with --ir pir, run int8 with --backend "
            "cpu, or export from Paddle 2.6"
        )


def write_onnx(model_dir):
    """model.onnx beside the Paddle model in ``model_dir``; returns its path. A quantized
    PIR export is converted in fp32 and its ranges written in."""
    quantization = exported.read_info(model_dir).get("quantization")
    pir = exported.is_pir_export(model_dir)
    check_converter(model_dir, bool(quantization), pir)
    path = os.path.join(model_dir, exported.ONNX_FILE)
    if quantization and pir:
        prefix = os.path.join(model_dir, exported.PREFIX)
        with exported.loaded(model_dir) as model:
            ranges = quantization.get("input_ranges") or pir_int8.qat_ranges(model)
            with pir_int8.fp32_model(prefix, model) as fp32_prefix:
                _paddle2onnx(model_dir, f"{fp32_prefix}.json", path)
        onnx_int8.from_fp32(path, ranges, quantization.get("add_input_ranges", ()))
        return path
    _paddle2onnx(model_dir, exported.model_file(model_dir), path)
    if quantization:
        onnx_int8.for_cpu_int8(path, matmul_input_ranges(model_dir))
    return path


def _paddle2onnx(model_dir, program_file, path):
    """``program_file`` (with the export's parameters) converted to ONNX at ``path``."""
    exported.check_paddle_reads(model_dir)
    paddle2onnx = require("paddle2onnx", "--onnx")
    params_file = os.path.join(os.path.dirname(program_file), exported.PARAMS_FILE)
    # paddle2onnx 2.x folds constants with Polygraphy by default, after setting
    # POLYGRAPHY_AUTOINSTALL_DEPS=1: Polygraphy then pip-installs onnx_graphsurgeon into
    # the running environment, with numpy 2 (seen on 2.1.0), under a Paddle that needs
    # numpy 1.26. Its onnxoptimizer path installs nothing.
    options = {"optimize_tool": "onnxoptimizer"} if optional.paddle2onnx_major >= 2 else {}
    with paddle_chatter(bootstrap.verbose()), native_chatter(bootstrap.verbose()):
        paddle2onnx.export(
            program_file, params_file, save_file=path, opset_version=13, verbose=False, **options
        )
    if not os.path.isfile(path):
        raise UserError(f"{model_dir}: paddle2onnx wrote no {exported.ONNX_FILE}")
