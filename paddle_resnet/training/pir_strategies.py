"""On PIR, what Fleet's meta-optimizers do on the legacy IR, done by the toolkit: Paddle
has no PIR implementation of ASP or of Fleet's static strategies.

- 2:4 sparsity: a persistable mask per prunable weight, multiplied into the weight in
  the program after every optimizer step (no trip through the host).
- mixed precision: Paddle's documented PIR AMP (``decorate``, ``auto_cast``,
  ``GradScaler``). bf16 needs one repair: the CPU batch-norm kernel takes no bf16 input
  (auto_cast feeds it bf16 even with batch_norm on the black list): an fp32 copy.
- data parallelism: each gradient summed over the ranks and divided by their number
  between the backward pass and the update.
"""

import contextlib

import paddle

from paddle_resnet.training import ir
from paddle_resnet.training.sparsity.masks import prunable_shapes
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX


def add_masks(program, weights):
    """A mask per weight (all ones), ``weight = weight * mask`` after the updates."""
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


def amp_level(amp_config):
    return "O2" if amp_config.use_pure_fp16 else "O1"


def mixed_precision(model, optimizer, amp_config):
    """``model`` and ``optimizer`` (None: eval) decorated, before the forward pass."""
    if amp_config.dtype == "bfloat16":
        for layer in model.sublayers():
            if isinstance(layer, paddle.nn.BatchNorm2D):
                layer.register_forward_pre_hook(
                    lambda layer, inputs: tuple(value.astype("float32") for value in inputs)
                )
    level = amp_level(amp_config)
    if optimizer is None:
        # O1 leaves the weights alone; O2 casts them, in the eval program as in training
        # (the two share the weights by name).
        if level == "O2":
            model = paddle.amp.decorate(models=model, level=level, dtype=amp_config.dtype)
        return model, None
    return paddle.amp.decorate(
        models=model, optimizers=optimizer, level=level, dtype=amp_config.dtype
    )


def autocast(amp_config):
    """Where the network is built: ops in the low precision by Paddle's lists."""
    return paddle.amp.auto_cast(level=amp_level(amp_config), dtype=amp_config.dtype)


def _loss_scaler(amp_config):
    """Paddle's GradScaler where loss scaling is asked for, or None."""
    scaling = amp_config.use_dynamic_loss_scaling or amp_config.scale_loss != 1.0
    if not amp_config.enabled or not scaling:
        return None
    return paddle.amp.GradScaler(
        init_loss_scaling=amp_config.scale_loss,
        use_dynamic_loss_scaling=amp_config.use_dynamic_loss_scaling,
    )


def _scaled(scaler, loss, amp_config):
    """The loss times the scale. PIR's ``GradScaler.scale`` multiplies only under dynamic
    scaling, while the update divides the gradients by the scale either way (Paddle
    3.3.1): a static scale would shrink every step by it, so it is applied here."""
    if amp_config.use_dynamic_loss_scaling:
        return scaler.scale(loss)
    return loss * amp_config.scale_loss


@contextlib.contextmanager
def _gradients_averaged_over_ranks(optimizer, ranks):
    """Within, ``optimizer.minimize`` averages each gradient over the ranks before its
    update: Paddle offers no hook there, so its ``backward`` is wrapped."""
    if ranks == 1:
        yield
        return
    backward = optimizer.backward

    def averaged(*args, **kwargs):
        params_grads = [(p, g) for p, g in backward(*args, **kwargs) if g is not None]
        for _, grad in params_grads:
            paddle.distributed.all_reduce(grad)
            paddle.assign(grad / ranks, output=grad)
        return params_grads

    optimizer.backward = averaged
    try:
        yield
    finally:
        del optimizer.backward


def minimize(config, optimizer, loss, kept_dense):
    """The optimizer step of the program being built, with ``config``'s strategies."""
    program = paddle.static.default_main_program()
    scaler = _loss_scaler(config.amp)
    with _gradients_averaged_over_ranks(optimizer, paddle.distributed.get_world_size()):
        if scaler is None:
            optimizer.minimize(loss)
        else:
            scaler.minimize(optimizer, _scaled(scaler, loss, config.amp))
    if config.asp.enabled:  # the weights ASP would prune
        weights = prunable_shapes(ir.parameters(program))
        add_masks(program, [p for p in weights if p.name not in kept_dense])
