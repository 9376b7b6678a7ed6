"""Paddle-TRT for a PIR export (inference.json).

On Paddle 3 a PIR program reaches TensorRT through ``paddle.tensorrt.convert``: it
lowers the program's subgraphs into ``tensorrt_engine`` ops, which a plain GPU predictor
runs. The conversion runs in a process of its own, on PIR for its whole length, and its
result is kept in ``<dir>/tensorrt/`` beside the settings it was made with.

PIR-TRT has no calibrator (INT8 comes from the model's own scales) and no 2:4 sparse
kernels (Paddle removed its sparsity switch, PR #53905). PyPI has no Paddle 3 GPU wheel,
and the CPU wheel has no ``paddle.tensorrt``: the settings are checked as data.
"""

import contextlib
import importlib
import json
import os
import sys

from paddle_resnet.core import child_process, feeds, paddle_internals
from paddle_resnet.core.atomic import staged_directory
from paddle_resnet.core.errors import ConfigError, UserError, exit_status
from paddle_resnet.deploy import exported
from paddle_resnet.deploy.predictor import ConfigCall, workspace_bytes


def conversion_settings(inference_config, input_shape, max_batch, quantized):
    """What ``paddle.tensorrt``'s ``Input`` and ``TensorRTConfig`` are given."""
    inf = inference_config
    if inf.trt_use_calib_mode:
        raise ConfigError(
            "--trt-use-calib-mode: Paddle-TRT on a PIR export (inference.json) has no "
            "calibrator; export with --ptq-algo (its scales), or export with --ir legacy"
        )
    if inf.trt_precision == "INT8" and not quantized:
        raise ConfigError(
            "--trt-precision INT8 on a PIR export needs the model's own scales: "
            "export it with --ptq-algo or --qat"
        )
    shape = list(input_shape)
    return {
        "input": {
            "name": feeds.IMAGE,
            "min_input_shape": [1, *shape],
            "optim_input_shape": [max_batch, *shape],
            "max_input_shape": [max_batch, *shape],
        },
        "precision_mode": inf.trt_precision,
        "workspace_size": workspace_bytes(inf.trt_workspace_size),
        "min_subgraph_size": inf.trt_min_subgraph_size,
    }


def predictor_calls(inference_config):
    """The converted model runs on a plain GPU predictor: its engines are in the program."""
    return [
        ConfigCall("switch_ir_optim", (True,)),
        ConfigCall("enable_use_gpu", (1024, inference_config.device_id)),
    ]


def converted_model(model_dir, inference_config, input_shape, max_batch, quantized):
    """The folder of ``model_dir``'s TensorRT conversion for these settings."""
    settings = conversion_settings(inference_config, input_shape, max_batch, quantized)
    folder = os.path.join(model_dir, exported.TENSORRT_DIR)
    with contextlib.suppress(OSError, ValueError):  # not converted yet, or unreadable: convert
        with open(os.path.join(folder, exported.TENSORRT_SETTINGS_FILE)) as handle:
            if json.load(handle) == settings:
                return folder
    with staged_directory(folder) as staging:
        child_process.run(
            ["-m", __name__, model_dir, json.dumps(settings), staging],
            f"{model_dir}: the TensorRT conversion failed",
        )
        with open(os.path.join(staging, exported.TENSORRT_SETTINGS_FILE), "w") as handle:
            json.dump(settings, handle)
    return folder


def convert(model_dir, settings, out_dir):
    """``paddle.tensorrt.convert`` on PIR; writes ``out_dir``/inference.json and .pdiparams."""
    try:
        tensorrt = importlib.import_module("paddle.tensorrt.export")
    except ImportError:
        raise UserError(
            "Paddle-TRT on a PIR export needs Paddle 3 built with TensorRT "
            "(paddlepaddle-gpu 3.x): this Paddle has no paddle.tensorrt"
        ) from None
    shapes = {key: tuple(value) for key, value in settings["input"].items() if key != "name"}
    image = tensorrt.Input(name=settings["input"]["name"], **shapes)
    config = tensorrt.TensorRTConfig(
        inputs=[image],
        min_subgraph_size=settings["min_subgraph_size"],
        save_model_dir=os.path.join(out_dir, exported.PREFIX),
        precision_mode=tensorrt.PrecisionMode[settings["precision_mode"]],
        workspace_size=settings["workspace_size"],
    )
    with paddle_internals.static_ir(True):
        tensorrt.convert(os.path.join(model_dir, exported.PIR_MODEL_FILE), config)


def main(argv=None):
    model_dir, settings, out_dir = sys.argv[1:] if argv is None else argv
    return exit_status(lambda: convert(model_dir, json.loads(settings), out_dir))


if __name__ == "__main__":
    sys.exit(main())
