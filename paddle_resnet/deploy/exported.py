"""The exported inference model folder, its format: the layout, model.json, and the
readers. Nothing here writes but ``write`` and ``write_info``: a reader never writes
(``check_dir`` only finishes a replacement a crash interrupted, as every read of a staged
folder does: ``core/atomic``).

    <dir>/inference.pdmodel, inference.pdiparams   program and weights (paddle.static.save_inference_model)
    <dir>/inference.json                           the program instead, exported from PIR (--ir pir)
    <dir>/classes.json                             label index -> class name
    <dir>/model.json                               architecture, input, preprocessing, sparsity, quantization
    <dir>/model.onnx                               export_model.py --onnx
    <dir>/openvino/model.xml, model.bin            OpenVINO's conversion, kept for the next run
    <dir>/tensorrt/inference.json, .pdiparams,     a PIR export's TensorRT conversion and the
                   settings.json                   settings it was made with
"""

import contextlib
import json
import os

import numpy as np
import paddle

from paddle_resnet.core import bootstrap, feeds, paddle_internals
from paddle_resnet.core.atomic import recover_staged
from paddle_resnet.core.class_index import CLASSES_FILE, read_class_index, write_class_index
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.text_files import read_json_object

PREFIX = "inference"
# The program file, by the IR it was exported from: legacy, PIR.
MODEL_FILE = PREFIX + ".pdmodel"
PIR_MODEL_FILE = PREFIX + ".json"
PARAMS_FILE = PREFIX + ".pdiparams"
INFO_FILE = "model.json"
ONNX_FILE = "model.onnx"
OPENVINO_DIR = "openvino"
OPENVINO_FILE = "model.xml"
TENSORRT_DIR = "tensorrt"
TENSORRT_SETTINGS_FILE = "settings.json"


def describe(config, input_shape, sparsity, quantization):
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
        "sparsity": sparsity,
        "quantization": quantization,
    }


def sparsity(info):
    """The sparsity record of model.json ``info`` (None: dense); an export written before
    the pattern was recorded listed its 2:4 weights as ``sparse_2to4``."""
    if "sparse_2to4" in info:
        return {"pattern": "2:4", "weights": info["sparse_2to4"]} if info["sparse_2to4"] else None
    return info.get("sparsity")


def write(out_dir, exe, program, image, output, classes):
    """The model and classes.json into ``out_dir``; its model.json follows (``write_info``)."""
    paddle.static.save_inference_model(
        os.path.join(out_dir, PREFIX), [image], [output], exe, program=program
    )
    write_class_index(os.path.join(out_dir, CLASSES_FILE), classes)


def write_info(out_dir, info):
    """model.json: what the model is and how it was made."""
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
    segmentation fault, without a word); the PIR-only rehearsal refuses a legacy export."""
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
    """(program file, parameters file), as paddle.inference.Config takes them."""
    check_paddle_reads(model_dir)
    return model_file(model_dir), os.path.join(model_dir, PARAMS_FILE)


def read_info(model_dir):
    """What the export recorded (model.json), the keys its readers take checked."""
    path = os.path.join(model_dir, INFO_FILE)
    required = {"num_classes": int, "layout": str, "input_shape": list, "preprocess": dict}
    try:
        return read_json_object(path, UserError, "an export's model.json", required)
    except OSError as err:
        raise UserError(f"{path}: unreadable ({err}); export the model again") from None


def quantized_in_paddle(model_dir):
    """Whether the export's Paddle program carries quantize ops, not only model.onnx (a PIR
    PTQ export: its program is fp32, its ranges in model.json)."""
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


def read_params(model_dir):
    """Parameter name -> array of an exported model."""
    with loaded(model_dir) as (program, scope):
        if is_pir_export(model_dir):  # a PIR program's other values have no names
            names = [p.name for p in program.global_block().all_parameters()]
        else:
            names = [v.name for v in program.list_vars() if v.persistable]
        return {
            name: np.array(scope.find_var(name).get_tensor())
            for name in names
            if name not in ("feed", "fetch")
        }
