"""On PIR, what Fleet's meta-optimizers do on the legacy IR, done by the toolkit: Paddle
has no PIR implementation of ASP or of Fleet's static strategies.

- 2:4 sparsity: a persistable mask per prunable weight, all ones until pruning sets it
  (``sparsity/masks.prune``), multiplied into the weight in the program after every
  optimizer step, so the pattern holds through training without a trip through the
  host; masks are saved and restored with the checkpoint like any persistable.
- data parallelism: each gradient summed over the ranks (``all_reduce`` over the ring
  ``distributed.init_fleet`` made: gloo on CPUs, NCCL on GPUs) and divided by their
  number between the backward pass and the update; every rank then takes the same step,
  the one a single process takes on the whole global batch.
"""

import paddle

from paddle_resnet.core import paddle_internals
from paddle_resnet.training import ir
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX


def prunable_weights(program, kept_dense):
    """The weights ASP would prune: convolution and fully connected weights that the
    model entry and ``--asp-exclude`` do not keep dense."""
    dense = set(kept_dense)
    return [
        p
        for p in ir.parameters(program)
        if p.trainable and len(p.shape) in (2, 4) and p.name not in dense
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
    ranks = paddle.distributed.get_world_size()
    if ranks > 1:
        params_grads = [(p, g) for p, g in optimizer.backward(loss) if g is not None]
        for _, grad in params_grads:
            paddle.distributed.all_reduce(grad)
            paddle.assign(grad / ranks, output=grad)
        paddle_internals.apply_optimize(optimizer, loss, params_grads)
    else:
        optimizer.minimize(loss)
    if config.asp.enabled:
        add_masks(program, prunable_weights(program, kept_dense))
