"""INT8: post-training quantization of an exported model, and the CPU check for running it.

Post-training quantization (PTQ) runs the fp32 model on real calibration images, picks
each activation's int8 range with the chosen algorithm (KL divergence, histogram
percentile, MSE, average or absolute maximum), takes each weight's per-channel absolute
maximum, and writes a model whose convolutions and matmuls carry those scales. Paddle
Inference runs it in INT8 with oneDNN (``--cpu-precision int8``); TensorRT reads the
same scales (speed and accuracy on the demo: docs/measurements.md, INT8).
"""

import os
import shutil
import tempfile

import numpy as np
import paddle
from paddle.static.quantization import PostTrainingQuantization
from paddle.static.quantization.quanter import _quant_config_default, convert, quant_aware

from paddle_resnet import bootstrap, exported, feeds, paddle_internals
from paddle_resnet.bootstrap import native_chatter, paddle_chatter
from paddle_resnet.devices import cpu_flags
from paddle_resnet.errors import ConfigError

# The ops that get int8 kernels (NVIDIA's QAT list, without the depthwise convolutions
# ResNets do not have).
QUANTIZABLE_OPS = ("conv2d", "mul", "matmul", "matmul_v2")
# Quantization-aware training as NVIDIA's Paddle ResNet-50 sets it (Fleet strategy.qat):
# channel-wise abs-max 8-bit weights, moving-average abs-max 8-bit activations.
FLEET_QAT_CONFIGS = {
    "channel_wise_abs_max": True,
    "weight_bits": 8,
    "activation_bits": 8,
    "not_quant_pattern": [],
    "algo": "",
}
# What Fleet's QAT meta-optimizer turns those into for the train program
# (qat_optimizer._gen_qat_config); the eval program gets the same.
QAT_PASS_CONFIG = dict(
    _quant_config_default,
    quantize_op_types=["conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2"],
    weight_quantize_type="channel_wise_abs_max",
    weight_bits=8,
    activation_bits=8,
    not_quant_pattern=[],
)
# model.json's record of a model exported from a QAT checkpoint
QAT_RECORD = {
    "method": "qat",
    "weights": "int8, channel-wise abs-max",
    "activations": "int8, moving-average abs-max (trained)",
    "ops": QAT_PASS_CONFIG["quantize_op_types"],
}
# The variables the quantization passes add and checkpoints keep (quantize_linear's
# scales and zero points).
QAT_SUFFIXES = ("@scale", "@zero_point")
# What Paddle's AMP appends to the name of a variable's fp16 copy.
AMP_CAST_SUFFIX = ".cast_fp16"
# Instruction-set extensions with int8 dot products; without them oneDNN's int8 kernels
# are slower than fp32.
INT8_CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


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
    """Replace the fp32 model in ``model_dir`` by its post-training quantized version,
    calibrated on the first ``count`` images of ``batches``; returns how, for model.json."""
    calibration, taken = calibration_feeds(batches, count)
    if taken < count:
        raise ConfigError(f"--calibration-images {count}: the calibration data hold only {taken}")
    model_file, params_file = (os.path.basename(p) for p in exported.model_paths(model_dir))
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), tempfile.TemporaryDirectory() as out:
        ptq = PostTrainingQuantization(
            executor=paddle.static.Executor(paddle.CPUPlace()),
            model_dir=model_dir,
            scope=scope,
            model_filename=model_file,
            params_filename=params_file,
            data_loader=_CalibrationLoader(calibration),
            batch_nums=len(calibration),
            algo=algo,
            quantizable_op_type=list(QUANTIZABLE_OPS),
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
        for name in (model_file, params_file):
            shutil.move(os.path.join(out, name), os.path.join(model_dir, name))
    return {
        "method": "ptq",
        "algo": algo,
        "calibration_images": taken,
        "calibration_data": "training images, validation preprocessing",
        "weights": "int8, channel-wise abs-max",
        "activations": f"int8, {algo}",
        "ops": list(QUANTIZABLE_OPS),
    }


def name_qat_variables(train_program):
    """Name the QAT variables of the train program so that checkpoints can be resumed and
    evaluated: each moving-average accumulator after the variable it tracks, and, under
    AMP, each scale after the fp32 variable, as the (fp32) eval program names it.

    The QAT pass numbers accumulators (``accum_14``, ``scale_accum@_26``) in an order that
    differs from process to process (measured: two identical runs held the same values
    under other names), so a resumed run would load every accumulator into another layer.
    Under AMP the pass quantizes the fp16 casts, so its scales are named after them
    (``conv2d_0.w_0.cast_fp16@scale``) where the eval program has ``conv2d_0.w_0@scale``:
    an evaluation of the checkpoint would have found none of its trained scales.
    The values the pass already put in the scope move with the names."""
    block, scope = train_program.global_block(), paddle.static.global_scope()
    place = paddle_internals.current_place()
    renames = {}
    for op in block.ops:
        for slot in ("InAccum", "InState"):
            if slot in op.input_names:
                tracked = op.input("X")[0].replace(AMP_CAST_SUFFIX, "")
                old, new = op.input(slot)[0], f"{tracked}@{op.type}.{slot[2:].lower()}"
                if renames.setdefault(old, new) != new:
                    raise RuntimeError(f"{old} tracks two variables: {renames[old]}, {new}")
    displaced = {}
    for var in list(block.vars.values()):
        if var.persistable and AMP_CAST_SUFFIX in var.name and var.name.endswith(QAT_SUFFIXES):
            fp32_name = var.name.replace(AMP_CAST_SUFFIX, "")
            renames[var.name] = fp32_name
            if fp32_name in block.vars:
                # An fp32 activation observed by its producer's output-scale op and quantized,
                # as its fp16 copy, for a matmul (the flattened features): the eval program
                # quantizes the fp32 variable with the matmul's scale, which takes the name.
                displaced[fp32_name] = f"{fp32_name}.fp32_output"
    for old, new in {**displaced, **renames}.items():
        initial = scope.find_var(old)
        paddle_internals.rename_var(block, old, new)
        if initial is not None:
            scope.var(new).get_tensor().set(np.array(initial.get_tensor()), place)


def freeze_qat(eval_program, place):
    """The QAT eval program as Paddle deploys it (``quanter.convert`` in the ONNX format):
    weights stored quantized with their trained scales, each quantized activation a
    quantize/dequantize pair, the training observers gone. Exported without it (as until
    now), the 2:4 QAT demo model ran in oneDNN int8 at 88.60 % top-1 where its own
    evaluation gave 89.15 % (95.5 % agreement), and paddle2onnx kept quantize/dequantize
    pairs on 3 of its 20 convolutions; frozen: 89.03 % (98.8 % agreement with the frozen
    model's own fp32 run, 89.11 %) and all 20. Changes the weights in the scope."""
    with paddle_chatter(bootstrap.verbose()):
        return convert(eval_program, place, config=QAT_PASS_CONFIG)


def quantize_eval_program(eval_program, place):
    """Insert the quantize/dequantize ops of QAT into ``eval_program`` in place, their
    scales named as the train program's (shared through the scope, saved in checkpoints).
    Fleet's ``qat_init`` does the same, but only for a run that built the optimizer; this
    serves evaluation-only runs and export too, before any weights are loaded."""
    with paddle_chatter(bootstrap.verbose()):  # progress bars
        quantized = quant_aware(
            eval_program,
            place,
            scope=paddle.static.global_scope(),
            config=QAT_PASS_CONFIG,
            for_test=True,
            return_program=True,
        )
    paddle_internals.replace_program(eval_program, quantized)


def cpu_has_int8_dot_products(cpuinfo="/proc/cpuinfo"):
    return bool(cpu_flags(cpuinfo) & set(INT8_CPU_FLAGS))
