"""On PIR, what Fleet's meta-optimizers do on the legacy IR, done by the toolkit: Paddle
has no PIR implementation of ASP or of Fleet's static strategies.

- 2:4 sparsity: a persistable mask per prunable weight, all ones until pruning sets it
  (``sparsity/masks.prune``), multiplied into the weight in the program after every
  optimizer step, so the pattern holds through training without a trip through the
  host; masks are saved and restored with the checkpoint like any persistable.
"""

import paddle

from paddle_resnet.training import ir
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX


def prunable_weights(program, kept_dense):
    """The weights ASP would prune: convolution and fully connected weights that the
    model entry and ``--asp-exclude`` do not keep dense."""
    return [
        p
        for p in ir.parameters(program)
        if p.trainable and len(p.shape) in (2, 4) and p.name not in set(kept_dense)
    ]


def add_masks(program, weights):
    """A mask per weight (all ones), applied after the optimizer ops already in
    ``program``: ``weight = weight * mask`` in place."""
    for weight in weights:
        mask = paddle.static.create_parameter(
            shape=weight.shape,
            dtype=weight.dtype,
            name=weight.name + MASK_SUFFIX,
            default_initializer=paddle.nn.initializer.Constant(1.0),
        )
        mask.stop_gradient = True
        mask.trainable = False
        paddle.assign(weight * mask, output=weight)


def minimize(config, optimizer, loss, kept_dense):
    """The optimizer step of the program being built (inside its ``program_guard``),
    with the strategies ``config`` asks for."""
    program = paddle.static.default_main_program()
    optimizer.minimize(loss)
    if config.asp.enabled:
        add_masks(program, prunable_weights(program, kept_dense))
