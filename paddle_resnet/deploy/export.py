"""Export: a checkpoint or pretrained parameters become the exported-model folder
(``exported.py``), written through a staging folder so an earlier export survives a
crash; optionally post-training quantized (``ptq.py``), converted to ONNX and OpenVINO,
and verified against the fp32 Paddle predictor on real images (``verify.py``)."""

import dataclasses
import json
import os

import paddle

from paddle_resnet.core import devices, feeds
from paddle_resnet.core.atomic import export_lock, staged_directory
from paddle_resnet.core.class_index import CLASSES_FILE, read_class_index
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.core.optional import require
from paddle_resnet.data.dali import open_split
from paddle_resnet.deploy import exported, model_input, pir_int8, verify
from paddle_resnet.deploy.ptq import quantize_in_place
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import ir
from paddle_resnet.training import programs as program_builder
from paddle_resnet.training.qat import (
    PIR_QAT_RECORD,
    QAT_RECORD,
    freeze_qat,
    quantize_eval_program,
)
from paddle_resnet.training.sparsity.pattern import check_sparse, sparse_parameters
from paddle_resnet.training.weights import (
    check_quantization,
    into_program,
    pretrained_file,
    program_state,
    read_weights,
)


def _classes(config, meta):
    """Class names from the checkpoint (given as a folder, or its model.pdparams as
    pretrained parameters), from a classes.json beside other parameters, or the label
    numbers."""
    if meta is not None:
        return meta["classes"]
    weights_file = pretrained_file(config.run)
    index = os.path.join(os.path.dirname(os.path.abspath(weights_file)), CLASSES_FILE)
    return (
        ckpt.classes_beside(weights_file)
        or (read_class_index(index) if os.path.exists(index) else None)
        or [str(i) for i in range(config.model.num_classes)]
    )


def export(config):
    """Write the inference model of ``config`` (from the IR of ``--ir``: inference.pdmodel
    from the legacy IR, inference.json from PIR); returns the export report."""
    if ir.is_pir(config) and config.inference.ptq_algo:
        pir_int8.check_algo(config.inference.ptq_algo)
    ir.check(config)
    directory = config.inference.directory
    with export_lock(directory, f"--inference-dir {directory}"), ir.selected(config):
        return _export(config)


def _export(config):
    # The exported model takes fp32 images, whatever DALI fed training (--dali-output-fp16).
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, output_fp16=False))
    meta, state = read_weights(config.run)
    if state is None:
        raise ConfigError("export needs --from-checkpoint or --from-pretrained-params")
    source = config.run.from_checkpoint or config.run.from_pretrained_params
    check_quantization(meta, state, config, source)
    if config.qat.enabled and config.inference.ptq_algo:
        raise ConfigError("--ptq-algo quantizes an fp32 model; a --qat model has its scales")
    if config.inference.verify_images and not config.data.image_root:
        raise ConfigError("--verify-images needs --image-root: it runs real validation images")
    if config.inference.onnx or config.inference.openvino:  # before the work, not after
        exported.check_onnx_converter(
            config.inference.directory,
            config.qat.enabled or bool(config.inference.ptq_algo),
            ir.is_pir(config),
        )
    programs = program_builder.build_programs(config, training=False)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(programs.startup)
    legacy_qat = config.qat.enabled and not ir.is_pir(config)
    if legacy_qat:  # PIR: the model was quantized as it was built
        quantize_eval_program(programs.eval, paddle.CPUPlace())
    state, _ = program_state(state, meta, programs.model, config, source)
    into_program.load_pretrained(programs.eval, state, source, config.model.arch)
    sparse = sparse_parameters(state)
    info = exported.describe(config, program_builder.input_shape(config), sparse)
    if config.qat.enabled:
        info["quantization"] = QAT_RECORD if legacy_qat else PIR_QAT_RECORD
    model = freeze_qat(programs.eval, paddle.CPUPlace()) if legacy_qat else programs.eval
    out_dir = config.inference.directory
    with staged_directory(out_dir) as staging:  # an earlier export survives a crash
        exported.write(
            staging,
            exe,
            model,
            ir.feed_target(model, feeds.IMAGE),
            ir.fetch_target(model, programs.eval_fetches["probs"]),
            _classes(config, meta),
        )
        if sparse:
            check_sparse(exported.read_params(staging), sparse, f"{out_dir} (exported)")
        if config.inference.ptq_algo:
            info["quantization"] = _post_training_quantize(config, staging, info)
        exported.write_info(staging, info)  # complete: what follows reads it
        if config.inference.onnx:
            exported.write_onnx(staging)
        if config.inference.openvino:
            openvino = require("openvino", "--openvino")
            exported.openvino_model(staging, openvino.Core(), openvino)
        if config.inference.verify_images:
            rows, images = verify.verify(
                staging, config.data, config.inference, config.inference.verify_images
            )
            info = dict(info, verification=rows)
            exported.write_info(staging, info)  # what --backend auto reads
            print(verify.table(rows, images))
    files = {
        name: os.path.getsize(os.path.join(out_dir, name)) for name in sorted(os.listdir(out_dir))
    }
    report = dict(info, directory=out_dir, files=files, source=source)
    with open(config.inference.export_log_path, "w") as handle:
        json.dump(report, handle, indent=1)
    return report


def _post_training_quantize(config, model_dir, info):
    """Quantize the fp32 model just written to ``model_dir``; returns how, for model.json.
    Calibration reads training images (never synthetic ones, and not the validation
    images the model is then measured on) through the validation pipeline."""
    inf = config.inference
    if not config.data.image_root:
        raise ConfigError("--ptq-algo needs --image-root: it calibrates on real training images")
    batches = calibration_batches(config, info)
    return quantize_in_place(model_dir, batches, inf.ptq_algo, inf.calibration_images)


def calibration_batches(config, info):
    """The calibration images of ``config`` (``--calibration-images``) as the model
    ``info`` describes takes them: feed batches through the validation pipeline, spread
    over the (class-sorted) training images, whose first ones are one class."""
    calibration = open_split(config.data, "train").spread(config.inference.calibration_images)
    return model_input.validation_batches(calibration, config.data, info)


def export_and_describe(config):
    for note in (devices.cpu_fallback_note(), ir.legacy_note(config)):
        if note:
            print(note)
    report = export(config)
    sizes = ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in report["files"].items())
    print(
        f"exported {report['arch']} ({report['layout']} {report['input_shape']}) "
        f"to {report['directory']}: {sizes}"
    )
