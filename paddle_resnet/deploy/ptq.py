"""Post-training quantization (PTQ) of an exported model: each activation's int8 range
from real calibration images, each weight's per-channel absolute maximum. A legacy export
goes through Paddle's PostTrainingQuantization (oneDNN and TensorRT read its scales); a PIR
export is calibrated by the toolkit itself (``pir_int8.calibrate``).
"""

import os
import shutil
import tempfile

import numpy as np
import paddle
from paddle.static.quantization import PostTrainingQuantization

from paddle_resnet.core import bootstrap, feeds, paddle_internals
from paddle_resnet.core.bootstrap import native_chatter, paddle_chatter
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.deploy import exported, pir_int8
from paddle_resnet.training.qat import int8_ops


class _CalibrationLoader(paddle.io.DataLoader):
    """The feed dicts PostTrainingQuantization wants, in the only type it accepts (it
    asserts ``isinstance(loader, paddle.io.DataLoader)`` and then calls the loader)."""

    def __init__(self, batches):
        self.batches = batches

    def __call__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def calibration_feeds(batches, count):
    """The first ``count`` images of ``batches`` (feed dicts) as feeds of the model input."""
    calibration, taken = [], 0
    for batch in batches:
        images = batch[feeds.IMAGE][: count - taken]
        calibration.append({feeds.IMAGE: np.ascontiguousarray(images)})
        taken += len(images)
        if taken == count:
            break
    return calibration, taken


def quantize_in_place(model_dir, batches, algo, count):
    """Calibrate the fp32 model in ``model_dir`` on ``count`` images; returns how, for
    model.json. A PIR export stays fp32, its ranges recorded for the int8 model.onnx."""
    calibration, taken = calibration_feeds(batches, count)
    if taken < count:
        raise ConfigError(f"--calibration-images {count}: the calibration data hold only {taken}")
    how = {
        "method": "ptq",
        "algo": algo,
        "calibration_images": taken,
        "calibration_data": "training images, validation preprocessing",
        "weights": "int8, channel-wise abs-max",
        "activations": f"int8, {algo}",
    }
    with exported.loaded(model_dir) as loaded:
        ops = int8_ops(loaded[0])  # what this model holds of what int8 quantizes
        if exported.is_pir_export(model_dir):
            images = [b[feeds.IMAGE] for b in calibration]
            ranges, add_ranges = pir_int8.calibrate(loaded, images, algo)
            how.update(ops=[*ops, "add (residual)"], ir="pir")
            return dict(how, input_ranges=ranges, add_input_ranges=add_ranges)
    _legacy_quantize(model_dir, calibration, algo, ops)
    return dict(how, ops=ops)


def _legacy_quantize(model_dir, calibration, algo, ops):
    """Paddle's PostTrainingQuantization of the legacy export in ``model_dir``, in place."""
    model_file, params_file = (os.path.basename(p) for p in exported.model_paths(model_dir))
    with paddle_internals.private_scope() as scope, tempfile.TemporaryDirectory() as out:
        ptq = PostTrainingQuantization(
            executor=paddle.static.Executor(paddle.CPUPlace()),
            model_dir=model_dir,
            scope=scope,
            model_filename=model_file,
            params_filename=params_file,
            data_loader=_CalibrationLoader(calibration),
            batch_nums=len(calibration),
            algo=algo,
            quantizable_op_type=ops,
            weight_quantize_type="channel_wise_abs_max",
            # quantize_linear / dequantize_linear pairs, as QAT writes them: oneDNN int8,
            # TensorRT and paddle2onnx read these (paddle2onnx aborts the process on
            # the older fake_quantize ops)
            activation_bits=8,
            weight_bits=8,
            onnx_format=True,
        )
        # progress bars, pass logs
        with paddle_chatter(bootstrap.verbose()), native_chatter(bootstrap.verbose()):
            ptq.quantize()
            ptq.save_quantized_model(out, model_filename=model_file, params_filename=params_file)
        del ptq  # and its executor, before their scope
        for name in (model_file, params_file):
            shutil.move(os.path.join(out, name), os.path.join(model_dir, name))
