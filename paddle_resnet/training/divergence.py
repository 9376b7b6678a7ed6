"""A run that diverges stops at the step it diverged, saves nothing non-finite and says
what to change, in one line (``errors.Diverged``: status 2, which no scheduler retries:
a restart from the last checkpoint would diverge again).

Where it is seen: the loss each step fetches anyway (every rank's, agreed through the
per-step all-reduce of ``lifecycle.StopRequests``, so every rank stops at the same step),
and the weights before every save and at every epoch's end (every rank checks its own:
the ranks hold the same weights, so they agree without a word). A step that AMP's dynamic
loss scaling skips on purpose (its gradients overflowed; the update is skipped and the
scale lowered) may fetch an inf or nan loss: that is no divergence, and the run goes on.
Without those, a diverged run saved the epoch's checkpoint with nan weights, then failed
in the evaluation predictor's conv_bn_fuse_pass with a traceback (a crash, requeued for
ever under Slurm), or, with --run-scope train_only, ended with status 0."""

import math

import numpy as np
import paddle

from paddle_resnet.core.errors import Diverged
from paddle_resnet.training import ir

# The value train_step adds where AMP scales the loss dynamically: 1.0 on a step it skipped.
AMP_SKIPPED = "amp_skipped"


class Watch:
    """One run's watch for divergence: what the steps fetch for it, the last checkpoint
    whose weights are finite (the one it started from, then each it saved), and the
    line that stops it."""

    def __init__(self, config, program, resumed_from=None):
        self.config = config
        self.program = program
        overflow = ir.loss_scaling_overflow(program)
        self.fetches = {} if overflow is None else {AMP_SKIPPED: overflow}
        self.last_finite = resumed_from

    def saved(self, directory):
        """``directory`` was saved with finite weights (checked first: ``check_weights``)."""
        self.last_finite = directory

    @staticmethod
    def step_diverged(values):
        """Whether a step whose fetched ``values`` these are diverged: a loss that is not
        finite, on a step AMP's dynamic loss scaling did not skip."""
        return not math.isfinite(values["loss"]) and not values.get(AMP_SKIPPED)

    def stop_at_step(self, values, where, ranks=(1, 1)):
        """The Diverged of a step ``where`` (e.g. "epoch 1, step 6 of 10") whose fetched
        ``values`` these are; ``ranks``: (how many saw a non-finite loss, of how many)."""
        seen, world = ranks
        if self.step_diverged(values):
            what = f"the loss is {values['loss']}"
        else:
            what = "the loss is not finite on another rank"
        if world > 1:
            what += f" ({seen} of {world} ranks)"
        return Diverged(self._line(where, f"{what} at learning rate {values['lr']:.6g}"))

    def check_weights(self, where):
        """Diverged when a persistable of the train program (weights, batch-norm
        statistics, optimiser state) holds nan or inf; before every save and at each
        epoch's end (``where``: "after epoch 2", ...)."""
        name = first_non_finite(self.program)
        if name is not None:
            raise Diverged(self._line(where, f"{name} holds nan or inf values"))

    def _line(self, where, what):
        if self.last_finite:
            last = (
                f"the last finite checkpoint: {self.last_finite} (--from-checkpoint "
                f"{self.last_finite} once changed)"
            )
        else:
            last = "no checkpoint of this run yet: start afresh once changed"
        return (
            f"training diverged {where}: {what}; nothing non-finite was saved; {last}. "
            f"To change: {'; '.join(self.advice())} (the losses before it: "
            f"{self.config.report_file})"
        )

    def advice(self):
        """What to change, for this run's settings."""
        config = self.config
        lines = [
            f"lower --lr (now {config.lr.base:g} per {config.lr.reference_batch} images) or lengthen --warmup-epochs "
            f"(now {config.lr.warmup_epochs:g})"
        ]
        if config.amp.enabled and config.amp.dtype == "float16":
            if not config.amp.use_dynamic_loss_scaling:
                lines.append(
                    "let AMP skip overflowing steps: --use-dynamic-loss-scaling (with --amp)"
                )
        if config.loss.class_weights:
            lines.append("check --class-weights: large weights scale the gradients")
        return lines


def first_non_finite(program):
    """The name of the first floating-point persistable of ``program`` whose value in the
    global scope holds nan or inf, else None."""
    scope = paddle.static.global_scope()
    for name in sorted(ir.persistable_names(program)):
        found = scope.find_var(name)
        if found is None:
            continue
        try:
            value = np.asarray(found.get_tensor())
        except (RuntimeError, ValueError, TypeError):  # not a dense tensor (a reader, ...)
            continue
        if value.dtype.kind == "f" and value.size and not np.isfinite(value).all():
            return name
    return None
