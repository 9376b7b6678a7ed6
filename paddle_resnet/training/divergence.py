"""A run that diverges stops at the step it diverged, saves nothing non-finite and says
what to change, in one line (``errors.Diverged``: status 2, which no scheduler retries:
a restart from the last checkpoint would diverge again).

Where it is seen: the loss each step fetches (agreed through ``lifecycle.StepAgreement``),
and the weights before every save and at every epoch's end. That check is the job's,
not one rank's: each rank's batch-norm statistics are its own, so one rank alone may find
a nan (it ended with 2 while rank 0 saved and waited for it); the ranks sum what each
found in one all-reduce. Either check may see a divergence first (a run at --lr 1e5 kept
a finite loss while its BN statistics went nan). A step that AMP's dynamic loss scaling
skips on purpose may fetch an inf loss: no divergence. Without this, a diverged run saved
nan weights, then crashed in the evaluation predictor's conv_bn_fuse_pass."""

import math

import numpy as np
import paddle

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.errors import Diverged
from paddle_resnet.training import ir

# The value train_step adds where AMP scales the loss dynamically: 1.0 on a step it skipped.
AMP_SKIPPED = "amp_skipped"


class Watch:
    """One run's watch for divergence: what the steps fetch for it, the last checkpoint
    whose weights are finite, and the line that stops it."""

    def __init__(self, config, program, resumed_from=None, all_reduce=None, rank=0, world_size=1):
        self.config = config
        self.program = program
        # the sum over the job's ranks (None with one), which the weights check agrees through
        self.all_reduce, self.rank, self.world_size = all_reduce, rank, world_size
        overflow = ir.loss_scaling_overflow(program)
        self.fetches = {} if overflow is None else {AMP_SKIPPED: overflow}
        self.last_finite = resumed_from

    def saved(self, directory):
        self.last_finite = directory

    @staticmethod
    def step_diverged(values):
        """A loss that is not finite, on a step AMP's dynamic loss scaling did not skip."""
        return not math.isfinite(values["loss"]) and not values.get(AMP_SKIPPED)

    def stop_at_step(self, values, where, ranks=(1, 1)):
        """The Diverged of a step ``where``; ``ranks``: (how many diverged, of how many)."""
        seen, world = ranks
        if self.step_diverged(values):
            what = f"the loss is {values['loss']}"
        else:
            what = "the loss is not finite on another rank"
        if world > 1:
            what += f" ({seen} of {world} ranks)"
        return Diverged(self._line(where, f"{what} at learning rate {values['lr']:.6g}"))

    def check_weights(self, where):
        """Diverged on every rank when a persistable of the train program holds nan or inf
        on any rank. Each rank puts the position of its first non-finite persistable in
        its own slot of one summed vector (one program: the same names on every rank)."""
        all_reduce, rank, world_size = self.all_reduce, self.rank, self.world_size
        names = sorted(ir.persistable_names(self.program))
        found = first_non_finite(self.program, names)
        if all_reduce is None or world_size == 1:
            if found is not None:
                raise Diverged(self._line(where, f"{found} holds nan or inf values"))
            return
        slots = np.zeros(max(world_size, 2))  # 1-element vectors have no program of their own
        slots[rank] = 0 if found is None else names.index(found) + 1
        summed = all_reduce(slots)
        ranks = [(r, int(summed[r]) - 1) for r in range(world_size) if summed[r] > 0]
        if ranks:
            first, index = ranks[0]
            what = f"{names[index]} holds nan or inf values on rank {first}"
            if len(ranks) > 1:
                what += f" ({len(ranks)} of {world_size} ranks found one)"
            else:
                what += f" (of {world_size} ranks, the only one)"
            raise Diverged(self._line(where, what))

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
        config = self.config
        lines = [
            f"lower --lr (now {config.lr.base:g} per {config.lr.reference_batch} images) or lengthen --warmup-epochs "
            f"(now {config.lr.warmup_epochs:g})"
        ]
        amp = config.amp
        if amp.enabled and amp.dtype == "float16" and not amp.use_dynamic_loss_scaling:
            lines.append("let AMP skip overflowing steps: --use-dynamic-loss-scaling (with --amp)")
        if config.loss.class_weights:
            lines.append("check --class-weights: large weights scale the gradients")
        return lines


def first_non_finite(program, names=None):
    """The first persistable of ``program`` (of ``names``) holding nan or inf, else None."""
    scope = paddle.static.global_scope()
    for name in names if names is not None else sorted(ir.persistable_names(program)):
        found = scope.find_var(name)
        if found is None:
            continue
        try:
            tensor = found.get_tensor()
            value = np.asarray(tensor)
        except (RuntimeError, ValueError, TypeError):  # not a dense tensor (a reader, ...)
            continue
        if value.size and not all_finite(value, paddle_internals.is_bfloat16(tensor)):
            return name
    return None


def all_finite(value, bfloat16=False):
    """Whether every element of ``value`` is finite; bfloat16 bits (uint16): nan and inf
    have all eight exponent bits set."""
    if bfloat16 and value.dtype == np.uint16:
        return not ((value & 0x7F80) == 0x7F80).any()
    return value.dtype.kind != "f" or bool(np.isfinite(value).all())
