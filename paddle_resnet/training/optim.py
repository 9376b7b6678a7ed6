"""Learning-rate schedules and the Momentum SGD optimizer."""

import math

import paddle
from paddle.optimizer.lr import LRScheduler
from paddle.regularizer import L2Decay


def peak_lr(lr_config, global_batch):
    """Linear scaling (Goyal et al. 2017): ``base`` is the LR for ``reference_batch`` images."""
    return lr_config.base * global_batch / lr_config.reference_batch


def lr_at_step(lr_config, step, steps_per_epoch, epochs, global_batch):
    """The learning rate of training step ``step`` (0-based, counted over all epochs)."""
    peak = peak_lr(lr_config, global_batch)
    warmup_steps = int(round(lr_config.warmup_epochs * steps_per_epoch))
    if step < warmup_steps:
        return lr_config.warmup_start_lr + (peak - lr_config.warmup_start_lr) * step / warmup_steps
    if lr_config.schedule == "cosine":
        decay_steps = max(1, epochs * steps_per_epoch - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        return 0.5 * peak * (1.0 + math.cos(math.pi * progress))
    epoch = step // steps_per_epoch
    drops = sum(1 for milestone in lr_config.milestones if epoch >= milestone)
    return peak * lr_config.decay_factor**drops


class StepwiseLR(LRScheduler):
    """``lr_at_step`` as a Paddle scheduler; ``last_epoch`` counts steps."""

    def __init__(self, lr_config, steps_per_epoch, epochs, global_batch):
        self._schedule = (lr_config, steps_per_epoch, epochs, global_batch)
        super().__init__(learning_rate=peak_lr(lr_config, global_batch))

    def get_lr(self):
        return lr_at_step(self._schedule[0], self.last_epoch, *self._schedule[1:])


def set_weight_decay(parameters, optimizer_config):
    """L2 decay on conv and FC weights only, unless ``bn_weight_decay``: decaying BN
    and biases costs about 0.5 % top-1 (He et al.). Momentum fuses it into its update."""
    decay = L2Decay(optimizer_config.weight_decay)
    for param in parameters:
        param.regularizer = (
            decay if (len(param.shape) > 1 or optimizer_config.bn_weight_decay) else None
        )


# --optimizer: the optimizers a recipe may name (NVIDIA's recipes name Momentum).
OPTIMIZERS = {"Momentum": paddle.optimizer.Momentum}


def build_optimizer(optimizer_config, lr_scheduler, multi_precision=False):
    return OPTIMIZERS[optimizer_config.name](
        learning_rate=lr_scheduler,
        momentum=optimizer_config.momentum,
        use_nesterov=optimizer_config.nesterov,
        weight_decay=None,  # per parameter: see set_weight_decay
        multi_precision=multi_precision,
    )
