"""What the static programs of a config hold, without running them (``program.py``):
ops, casts, parameters, multiply-accumulates per image, the strategies applied."""

import math

from paddle_resnet.training import ir
from paddle_resnet.training.programs import applied_strategies
from paddle_resnet.training.qat import is_qat_variable
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX

CONVOLUTIONS = ("conv2d", "depthwise_conv2d")
# Ops that exist only where a fusion pass or a strategy put them.
FUSED_PREFIXES = ("fused_", "fusion_", "resnet_unit", "conv2d_fusion")


def macs_per_image(program):
    """Multiply-accumulates of one image through the convolutions and matmuls of
    ``program`` (batch-norm, activations and pooling are a few % more)."""
    total = 0
    for kind, (x, weight), (out,) in ir.op_shapes(program):
        if kind in CONVOLUTIONS:  # weight [Cout, Cin/groups, kh, kw]
            total += math.prod(out[1:]) * math.prod(weight[1:])
        elif len(weight) == 2 and weight[0] == x[-1]:
            total += math.prod(x[1:]) * weight[1]
    return total


def model_parameters(program):
    """(count, tensors) of the model's trainable parameters: no batch-norm statistics,
    ASP masks or QAT scales (the count model zoos quote: 25,557,032 for ResNet-50)."""
    params = [
        p
        for p in ir.parameters(program)
        if p.trainable and not p.name.endswith(MASK_SUFFIX) and not is_qat_variable(p.name)
    ]
    return sum(math.prod(p.shape) for p in params), len(params)


def describe_program(program):
    ops = ir.op_types(program)
    count, tensors = model_parameters(program)
    return {
        "ops": sum(ops.values()),
        "ops_by_type": dict(ops.most_common()),
        "casts": ops.get("cast", 0),
        "parameters": count,
        "parameter_tensors": tensors,
        "fused_ops": {t: n for t, n in ops.items() if t.startswith(FUSED_PREFIXES)},
    }


def describe(programs):
    """{"eval": ..., "train": ..., "strategies": ...} of built ``programs``."""
    result = {"eval": describe_program(programs.eval)}
    result["eval"]["macs_per_image"] = macs_per_image(programs.eval)
    if programs.train is not None:
        result["train"] = describe_program(programs.train)
        result["strategies"] = applied_strategies(programs.train)
    return result
