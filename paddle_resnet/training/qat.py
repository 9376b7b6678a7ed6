"""Quantization-aware training: Fleet's QAT settings for the train program, the same pass
over the eval program (run before weights load, so a QAT checkpoint resumes and exports
exactly), the accumulator naming that makes QAT resume exact, and the conversion of the
trained eval program into the int8 program Paddle deploys.
"""

import numpy as np
import paddle
from paddle.static.quantization.quanter import convert, quant_aware

from paddle_resnet.core import bootstrap, paddle_internals
from paddle_resnet.core.bootstrap import paddle_chatter
from paddle_resnet.training import ir

# The op types Paddle's int8 quantizes (weights and inputs; the list Fleet's QAT
# meta-optimizer gives its pass). Which of them a model holds is read from its program
# (``int8_ops``): a family with depthwise convolutions has them quantized too.
INT8_OP_TYPES = ("conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2")
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
    paddle_internals.QUANT_CONFIG_DEFAULT,
    quantize_op_types=list(INT8_OP_TYPES),
    weight_quantize_type="channel_wise_abs_max",
    weight_bits=8,
    activation_bits=8,
    not_quant_pattern=[],
)
# model.json's record of a model exported from a QAT checkpoint (with the ``int8_ops`` of
# its program)
QAT_RECORD = {
    "method": "qat",
    "weights": "int8, channel-wise abs-max",
    "activations": "int8, moving-average abs-max (trained)",
}
# ... and from a PIR QAT checkpoint (paddle.quantization, paddle_internals.pir_qat_config)
PIR_QAT_RECORD = {
    "method": "qat",
    "weights": "int8, abs-max per tensor (moving average, trained)",
    "activations": "int8, moving-average abs-max (trained)",
    "ir": "pir",
}
# The variables the quantization passes add and checkpoints keep (quantize_linear's
# scales and zero points).
QAT_SUFFIXES = ("@scale", "@zero_point")
# ... and the parameters of paddle.quantization's quanters on PIR (scale, state, accum)
PIR_QAT_PREFIX = "quant_dequant."


def int8_ops(program):
    """The op types of ``program`` that int8 quantizes, as model.json lists them."""
    return sorted(set(ir.op_sequence(program)) & set(INT8_OP_TYPES))


def is_qat_variable(name):
    """Whether ``name`` is a QAT scale or quantizer state (either IR), not a weight."""
    return name.endswith(QAT_SUFFIXES) or name.startswith(PIR_QAT_PREFIX)


# What Paddle's AMP appends to the name of a variable's fp16 copy.
AMP_CAST_SUFFIX = ".cast_fp16"


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
    renames = {**displaced, **renames}
    found = {new: scope.find_var(old) for old, new in renames.items()}
    # read before any is set: a name renamed away may be another's new name
    initial = {new: np.array(var.get_tensor()) for new, var in found.items() if var is not None}
    paddle_internals.rename_vars(block, renames)
    for new, value in initial.items():
        scope.var(new).get_tensor().set(value, place)


def freeze_qat(eval_program, place):
    """The QAT eval program as Paddle deploys it (``quanter.convert``): weights quantized
    with their trained scales, quantize/dequantize pairs, the observers gone. Unfrozen,
    the 2:4 QAT demo ran in int8 at 88.60 % top-1 for its own 89.15 %, and paddle2onnx
    kept the pairs on 3 of 20 convolutions; frozen: 89.03 % and all 20. Changes the
    weights in the scope."""
    with paddle_chatter(bootstrap.verbose()):
        return convert(eval_program, place, config=QAT_PASS_CONFIG)


def quantize_eval_program(eval_program, place):
    """QAT's quantize/dequantize ops into ``eval_program``, their scales named as the
    train program's (Fleet's ``qat_init`` does so only where the optimizer was built)."""
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
