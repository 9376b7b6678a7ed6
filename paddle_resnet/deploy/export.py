"""Export: a checkpoint or pretrained parameters become the exported-model folder, written
through a staging folder so an earlier export survives a crash; optionally quantized,
converted to ONNX and OpenVINO, and verified against the fp32 Paddle predictor."""

import dataclasses
import json
import os

import paddle

from paddle_resnet.core.atomic import export_lock, staged_directory
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.core.optional import require
from paddle_resnet.data.dali import open_split
from paddle_resnet.deploy import (
    dali_input,
    exported,
    onnx_export,
    openvino_conversion,
    pir_int8,
    sparsity_report,
    verify,
)
from paddle_resnet.deploy.ptq import quantize_in_place
from paddle_resnet.training import prepare


def export(config):
    """Write the inference model of ``config``; returns the export report."""
    # The exported model takes fp32 images, whatever DALI fed training (--dali-output-fp16).
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, output_fp16=False))
    inf = config.inference
    if config.qat.enabled and inf.ptq_algo:
        raise ConfigError("--ptq-algo quantizes an fp32 model; a --qat model has its scales")
    if inf.verify_images and not config.data.image_root:
        raise ConfigError("--verify-images needs --image-root: it runs real validation images")
    with (
        export_lock(inf.directory, f"--inference-dir {inf.directory}"),
        prepare.inference_model(config, paddle.CPUPlace()) as model,
    ):
        if model.pir and inf.ptq_algo:
            pir_int8.check_algo(inf.ptq_algo)
        if inf.onnx or inf.openvino:  # before the work, not after
            quantized = config.qat.enabled or bool(inf.ptq_algo)
            onnx_export.check_converter(inf.directory, quantized, model.pir)
        return _write(config, model)


def _write(config, model):
    """The folder of ``model``, complete or not at all, and the export report."""
    inf, out_dir = config.inference, config.inference.directory
    info = exported.describe(config, model.input_shape, model.sparsity, model.quantization)
    with staged_directory(out_dir) as staging:  # an earlier export survives a crash
        exported.write(staging, model.exe, model.program, model.image, model.output, model.classes)
        if inf.ptq_algo:
            # calibrated on training images, not the validation images the model is measured on
            if not config.data.image_root:
                raise ConfigError(
                    "--ptq-algo needs --image-root: it calibrates on real training images"
                )
            info["quantization"] = quantize_in_place(
                staging, calibration_batches(config, info), inf.ptq_algo, inf.calibration_images
            )
        exported.write_info(staging, info)  # complete: what follows reads it
        # the weights model.json names as sparse hold their pattern in what ships
        sparsity_report.check(staging, f"{out_dir} (exported)")
        if inf.onnx:
            onnx_export.write_onnx(staging)
        if inf.openvino:
            openvino = require("openvino", "--openvino")
            openvino_conversion.openvino_model(staging, openvino.Core(), openvino)
        if inf.verify_images:
            rows, images = verify.verify(staging, config.data, inf, inf.verify_images)
            info = dict(info, verification=rows)
            exported.write_info(staging, info)  # what --backend auto reads
            print(verify.table(rows, images))
    files = {n: os.path.getsize(os.path.join(out_dir, n)) for n in sorted(os.listdir(out_dir))}
    report = dict(info, directory=out_dir, files=files, source=model.source)
    with open(inf.export_log_path, "w") as handle:
        json.dump(report, handle, indent=1)
    return report


def calibration_batches(config, info):
    """The calibration images, spread over the class-sorted training images."""
    calibration = open_split(config.data, "train").spread(config.inference.calibration_images)
    return dali_input.validation_batches(calibration, config.data, info)
