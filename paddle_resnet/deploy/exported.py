"""The exported inference model folder: written by export_model.py, read by inference.py,
the predictor and the sparsity checker. This module is its only owner.

    <dir>/inference.pdmodel, inference.pdiparams   program and weights (paddle.static.save_inference_model)
    <dir>/inference.json                           the program instead, exported from PIR (--ir pir)
    <dir>/classes.json                             label index -> class name
    <dir>/model.json                               architecture, input, preprocessing, sparse weights
    <dir>/model.onnx                               export_model.py --onnx
    <dir>/openvino/model.xml, model.bin            OpenVINO's conversion, cached on first use
"""

import contextlib
import dataclasses
import json
import os

import numpy as np
import paddle

from paddle_resnet.core import bootstrap, feeds, optional, paddle_internals
from paddle_resnet.core.atomic import recover_staged, staged_directory
from paddle_resnet.core.bootstrap import native_chatter, paddle_chatter
from paddle_resnet.core.class_index import CLASSES_FILE, read_class_index, write_class_index
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.optional import require
from paddle_resnet.deploy import onnx_int8, pir_int8

PREFIX = "inference"
# The program file, by the IR it was exported from: legacy, PIR.
MODEL_FILE = PREFIX + ".pdmodel"
PIR_MODEL_FILE = PREFIX + ".json"
PARAMS_FILE = PREFIX + ".pdiparams"
INFO_FILE = "model.json"
ONNX_FILE = "model.onnx"
OPENVINO_DIR = "openvino"
OPENVINO_FILE = "model.xml"


def describe(config, input_shape, sparse):
    """model.json's content for a model exported from ``config``."""
    data = config.data
    return {
        "arch": config.model.arch,
        "num_classes": config.model.num_classes,
        "layout": config.model.data_layout,
        "input_shape": list(input_shape),
        "input": feeds.IMAGE,
        "output": "probabilities (softmax)",
        "preprocess": {
            "resize_short": data.resize_short,
            "crop_size": data.crop_size,
            "normalize_mean": list(data.normalize_mean),
            "normalize_std": list(data.normalize_std),
            "normalize_scale": data.normalize_scale,
        },
        "sparse_2to4": list(sparse),
        "quantization": None,
    }


def write(out_dir, exe, program, image, output, classes):
    """The model (``image`` in, ``output`` out) and classes.json into ``out_dir``; its
    model.json follows, once the export knows all of it (``write_info``)."""
    paddle.static.save_inference_model(
        os.path.join(out_dir, PREFIX), [image], [output], exe, program=program
    )
    write_class_index(os.path.join(out_dir, CLASSES_FILE), classes)


def write_info(out_dir, info):
    """model.json: what the model is and how it was made (``describe``, quantization)."""
    with open(os.path.join(out_dir, INFO_FILE), "w") as handle:
        json.dump(info, handle, indent=1)


def check_dir(model_dir):
    """UserError naming the first missing file of an exported model. An export that a
    crash interrupted while replacing this folder is finished first."""
    recover_staged(os.path.dirname(os.path.abspath(model_dir)))
    if not os.path.isdir(model_dir):
        raise UserError(f"inference model folder {model_dir!r} does not exist")
    for name in (os.path.basename(model_file(model_dir)), PARAMS_FILE, INFO_FILE):
        path = os.path.join(model_dir, name)
        if not os.path.isfile(path):
            raise UserError(
                f"{path} is missing: export a model with export_model.py "
                f"--inference-dir {model_dir}"
            )


def is_exported_model(path):
    """An export folder; not a PIR checkpoint, whose program file is also model.json."""
    return all(os.path.isfile(os.path.join(path, name)) for name in (INFO_FILE, PARAMS_FILE))


def model_file(model_dir):
    """The program file of the export in ``model_dir``: inference.json from PIR, else
    inference.pdmodel (whether it exists or not)."""
    pir = os.path.join(model_dir, PIR_MODEL_FILE)
    return pir if os.path.isfile(pir) else os.path.join(model_dir, MODEL_FILE)


def is_pir_export(model_dir):
    return model_file(model_dir).endswith(PIR_MODEL_FILE)


def check_paddle_reads(model_dir):
    """UserError, in one line, where the running Paddle cannot read the export's program:
    PIR's inference.json needs Paddle 3 (Paddle 2.6's predictor crashed on it with a
    segmentation fault, without a word). ONNX Runtime and OpenVINO serve its model.onnx
    on any Paddle. In the PIR-only rehearsal a legacy export is refused: its program is
    the legacy IR's."""
    if not is_pir_export(model_dir) and bootstrap.pir_only():
        raise UserError(
            f"{model_dir}: exported from the legacy IR (inference.pdmodel), which "
            f"{bootstrap.PIR_ONLY_VARIABLE}=1 makes unavailable: export it again with --ir pir"
        )
    if not is_pir_export(model_dir) or paddle_internals.PADDLE3:
        return
    if os.path.exists(os.path.join(model_dir, ONNX_FILE)):
        instead = "or serve its model.onnx here with --backend onnxruntime or openvino"
    else:
        instead = "or export it with --onnx there and serve model.onnx with --backend onnxruntime"
    raise UserError(
        f"{model_dir}: exported from PIR (inference.json), which Paddle {paddle.__version__} "
        f"cannot read: use Paddle 3, {instead}"
    )


def model_paths(model_dir):
    """(program file, parameters file), as paddle.inference.Config takes them (either
    program format: Paddle Inference reads both; Paddle 2.6 the legacy one only)."""
    check_paddle_reads(model_dir)
    return model_file(model_dir), os.path.join(model_dir, PARAMS_FILE)


def openvino_model(model_dir, core, ov):
    """The exported model as OpenVINO reads it: converted once (about a second for
    ResNet-50), then read from ``<dir>/openvino/model.xml`` while that is newer than its
    source. The source is inference.pdmodel, or model.onnx (written now if missing) for a
    quantized model and for a PIR export: OpenVINO 2026.4's Paddle reader refuses
    Paddle's per-channel quantize/dequantize ops ("quant_axis is NOT in the range of
    [-1]") and reads no .json ("format .json is not supported"); its ONNX reader takes
    both. A folder that cannot be written is converted every time."""
    cached = os.path.join(model_dir, OPENVINO_DIR, OPENVINO_FILE)
    source = os.path.join(model_dir, MODEL_FILE)
    if read_info(model_dir).get("quantization") or is_pir_export(model_dir):
        source = os.path.join(model_dir, ONNX_FILE)
        if not os.path.exists(source):
            write_onnx(model_dir)
    if os.path.exists(cached) and os.path.getmtime(cached) >= os.path.getmtime(source):
        return core.read_model(cached)
    model = core.read_model(source)
    with contextlib.suppress(OSError):  # read-only: convert each time
        with staged_directory(os.path.dirname(cached)) as staging:
            ov.save_model(model, os.path.join(staging, OPENVINO_FILE), compress_to_fp16=False)
    return model


def read_info(model_dir):
    """What the export recorded: architecture, input shape, layout, preprocessing."""
    path = os.path.join(model_dir, INFO_FILE)
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: unreadable ({err}); export the model again") from None


def quantized_in_paddle(model_dir):
    """Whether the export's Paddle program carries quantize ops (a quantized legacy
    export, a PIR QAT export), not only model.onnx (a PIR PTQ export: its program is
    fp32, its ranges in model.json)."""
    quantization = read_info(model_dir).get("quantization")
    return bool(quantization) and "input_ranges" not in quantization


def read_classes(model_dir):
    return read_class_index(os.path.join(model_dir, CLASSES_FILE))


@contextlib.contextmanager
def loaded(model_dir):
    """(program, scope holding its persistables) of an exported model, while in use."""
    check_paddle_reads(model_dir)
    paddle.enable_static()  # load_inference_model works in static mode only
    ir = paddle_internals.static_ir(is_pir_export(model_dir))
    with ir, paddle_internals.private_scope() as scope:
        exe = paddle.static.Executor(paddle.CPUPlace())
        program, _, _ = paddle.static.load_inference_model(os.path.join(model_dir, PREFIX), exe)
        del exe  # gone before its scope
        yield program, scope


def _value(scope, name):
    return np.array(scope.find_var(name).get_tensor())


def read_params(model_dir):
    """Parameter name -> array of an exported model."""
    with loaded(model_dir) as (program, scope):
        if is_pir_export(model_dir):  # a PIR program's other values have no names
            names = [p.name for p in program.global_block().all_parameters()]
        else:
            names = [v.name for v in program.list_vars() if v.persistable]
        return {name: _value(scope, name) for name in names if name not in ("feed", "fetch")}


def matmul_input_ranges(model_dir):
    """{weight name: the int8 range (absolute maximum) of its input} for each matmul of
    a quantized legacy export whose input and weight are both quantized (the classifier):
    paddle2onnx 1.2.11 writes those matmuls in fp32, dropping the input's quantization
    and folding the weight's, so ``onnx_int8`` restores them from these ranges."""
    with loaded(model_dir) as (program, scope):
        ops = program.global_block().ops
        dequantized = {op.output("Y")[0]: op for op in ops if op.type == "dequantize_linear"}
        ranges = {}
        for op in ops:
            if op.type not in ("mul", "matmul", "matmul_v2"):
                continue
            data, weight = (dequantized.get(op.input(slot)[0]) for slot in ("X", "Y"))
            if data is not None and weight is not None:
                scale = _value(scope, data.input("Scale")[0])
                ranges[weight.input("X")[0]] = float(scale.reshape(-1)[0])
        return ranges


def checked_batch(images, input_shape):
    """``images`` as the contiguous float32 batch a backend takes, or a UserError when
    their shape is not the model's ``input_shape`` (without the batch)."""
    images = np.ascontiguousarray(images, dtype=np.float32)
    if images.ndim != 4 or tuple(images.shape[1:]) != tuple(input_shape):
        raise UserError(
            f"input of shape {tuple(images.shape)} does not fit the model, "
            f"which takes [batch, {', '.join(map(str, input_shape))}]"
        )
    return images


def preprocessing(data_config, info):
    """``data_config`` with the validation preprocessing the model was exported with."""
    pre = info["preprocess"]
    return dataclasses.replace(
        data_config,
        crop_size=pre["crop_size"],
        resize_short=pre["resize_short"],
        normalize_mean=tuple(pre["normalize_mean"]),
        normalize_std=tuple(pre["normalize_std"]),
        normalize_scale=pre.get("normalize_scale", 1.0 / 255.0),
        output_fp16=False,
    )  # the predictor's input is fp32


def check_onnx_converter(model_dir, quantized, pir):
    """UserError when the installed paddle2onnx cannot convert this model: 1.x reads no
    PIR inference.json; 2.x (the one for Paddle 3) converts Paddle's int8
    quantize/dequantize ops as float8 only (it aborts the process: "Only support e4m3 or
    e5m2 now"), so a quantized legacy export needs 1.2.11; a quantized PIR export is
    converted in fp32 and quantized by the toolkit (``pir_int8``)."""
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
    legacy export keeps its quantize/dequantize pairs as ONNX QDQ nodes (rewritten for
    CPU kernels by ``onnx_int8.for_cpu_int8``); a quantized PIR export is converted in
    fp32 and its recorded or trained ranges written in (``onnx_int8.from_fp32``)."""
    quantization = read_info(model_dir).get("quantization")
    pir = is_pir_export(model_dir)
    check_onnx_converter(model_dir, bool(quantization), pir)
    path = os.path.join(model_dir, ONNX_FILE)
    if quantization and pir:
        with loaded(model_dir) as model:
            ranges = quantization.get("input_ranges") or pir_int8.qat_ranges(model)
            with pir_int8.fp32_model(os.path.join(model_dir, PREFIX), model) as fp32_prefix:
                _paddle2onnx(model_dir, f"{fp32_prefix}.json", path)
        onnx_int8.from_fp32(path, ranges, quantization.get("add_input_ranges", ()))
        return path
    _paddle2onnx(model_dir, model_file(model_dir), path)
    if quantization:
        onnx_int8.for_cpu_int8(path, matmul_input_ranges(model_dir))
    return path


def _paddle2onnx(model_dir, program_file, path):
    """``program_file`` (with the export's parameters) converted to ONNX at ``path``."""
    check_paddle_reads(model_dir)
    paddle2onnx = require("paddle2onnx", "--onnx")
    params_file = os.path.join(os.path.dirname(program_file), PARAMS_FILE)
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
        raise UserError(f"{model_dir}: paddle2onnx wrote no {ONNX_FILE}")
