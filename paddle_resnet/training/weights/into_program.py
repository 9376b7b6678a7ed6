"""State into a built program: a checkpoint's every persistable variable (strict, a
resumed run), or the parameters of start weights whose names and shapes match (a new
classifier allowed to differ). The on-disk format is ``checkpoint.py``'s."""

import numpy as np
import paddle

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.training import ir
from paddle_resnet.training.qat import QAT_SUFFIXES, is_qat_variable
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX


def persistable_variables(program):
    return [v for v in program.list_vars() if v.persistable and v.name not in ("feed", "fetch")]


def current_state(program):
    """{name: a copy of its array} of ``program``'s persistables, for ``restore_state``."""
    scope = paddle.static.global_scope()
    return {
        v.name: np.array(scope.find_var(v.name).get_tensor())
        for v in persistable_variables(program)
    }


def restore_state(program, state):
    """Put every persistable variable of ``program`` back from ``state`` (strict)."""
    variables = persistable_variables(program)
    missing = [v.name for v in variables if v.name not in state]
    if missing:
        raise CheckpointError(
            f"checkpoint lacks {len(missing)} variables of this program, "
            f"e.g. {missing[:3]}; was it written by another configuration?"
        )
    _assign(variables, state)


def load_pretrained(program, state, source, arch, may_skip=(), masks=False):
    """Copy the parameters whose names and shapes match; the ones skipped, as "name
    (why)". ASP masks (with ``masks``) and PIR's quantizer parameters are copied where the
    file has them (else pruning sets them; QAT starts fresh). Only ``may_skip`` (a new
    classifier) may be skipped: another mismatch is a CheckpointError. Values are cast to
    the parameter's dtype (pure-fp16 checkpoints into fp32 programs)."""
    chosen, skipped, unexpected = [], [], []
    for param in ir.parameters(program):
        mask = param.name.endswith(MASK_SUFFIX)
        if mask or is_qat_variable(param.name):
            if param.name in state and (masks or not mask):
                chosen.append(param)
            continue
        if param.name not in state:
            reason = "not in the file"
        elif tuple(state[param.name].shape) != tuple(param.shape):
            reason = (
                f"shape {tuple(state[param.name].shape)} in the file, {tuple(param.shape)} here"
            )
        else:
            chosen.append(param)
            continue
        skipped.append(f"{param.name} ({reason})")
        if param.name not in may_skip:
            unexpected.append(skipped[-1])
    if unexpected:
        raise CheckpointError(
            f"{source}: does not fit {arch}: {len(unexpected)} parameters "
            f"do not match, e.g. {unexpected[0]}"
        )
    # A QAT checkpoint's trained quantization scales, where the program has them too (an
    # eval program's own output scales, e.g. of its softmax, are not in a checkpoint).
    chosen += [
        v
        for v in persistable_variables(program)
        if v.name.endswith(QAT_SUFFIXES) and v.name in state
    ]
    _assign(chosen, state, cast=True)
    # Pure fp16: the optimizer updates fp32 master copies and casts them back, so the
    # loaded weights must reach the masters too (they hold the random initialisation,
    # cast when the startup program ran, and the first step would bring it back).
    masters = master_weights(program)
    _assign(
        [program.global_block().var(masters[v.name]) for v in chosen if v.name in masters],
        {masters[name]: value for name, value in state.items() if name in masters},
        cast=True,
    )
    return skipped


def master_weights(program):
    """{parameter: its fp32 master copy} of a legacy pure-fp16 train program, else {}."""
    if paddle_internals.is_pir_program(program):
        return {}
    return {
        op.input("Param")[0]: op.input("MasterParam")[0]
        for op in program.global_block().ops
        if "MasterParam" in op.input_names and op.input("MasterParam")
    }


def _assign(variables, state, cast=False):
    scope = paddle.static.global_scope()
    place = paddle_internals.current_place()
    for var in variables:
        tensor = scope.var(var.name).get_tensor()
        value = np.asarray(state[var.name])
        if cast:
            value = value.astype(paddle_internals.numpy_dtype(var.dtype), copy=False)
        if tuple(value.shape) != tuple(var.shape) and -1 not in var.shape:
            raise CheckpointError(
                f"{var.name}: shape {value.shape} in the checkpoint, "
                f"{tuple(var.shape)} in the program"
            )
        tensor.set(value, place)
