"""A run that diverges stops at the step it diverged, saves nothing non-finite and says
what to change, in one line (``errors.Diverged``: status 2, which no scheduler retries:
a restart from the last checkpoint would diverge again).

Where it is seen: the loss each step fetches anyway (every rank's, agreed through the
per-step all-reduce of ``lifecycle.StepAgreement``, so every rank stops at the same step),
and the weights before every save and at every epoch's end. That check is the job's
decision, not one rank's: each rank holds batch-norm statistics of its own batches, so
one rank alone may find a nan; it ended that rank with 2 while rank 0 saved and then
waited in the next collective until it was killed. The ranks sum what each found in one
all-reduce (``check_weights``), and every rank stops with the same line naming the rank
and the tensor. Which of the two checks sees a divergence first is the numerics' choice
(on an AMX Xeon a run at --lr 1e5 kept a finite loss while its BN statistics went nan):
both end the run alike. A step that AMP's dynamic
loss scaling skips on purpose (its gradients overflowed; the update is skipped and the
scale lowered) may fetch an inf or nan loss: that is no divergence, and the run goes on.
Without those, a diverged run saved the epoch's checkpoint with nan weights, then failed
in the evaluation predictor's conv_bn_fuse_pass with a traceback (a crash, requeued for
ever under Slurm), or, with --run-scope train_only, ended with status 0."""

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
    whose weights are finite (the one it started from, then each it saved), and the
    line that stops it."""

    def __init__(self, config, program, resumed_from=None, all_reduce=None, rank=0, world_size=1):
        self.config = config
        self.program = program
        # the sum over the job's ranks (None with one), which the weights check agrees through
        self.all_reduce, self.rank, self.world_size = all_reduce, rank, world_size
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
        """Diverged on every rank when a persistable of the train program (weights,
        batch-norm statistics, optimiser state; bf16 ones included) holds nan or inf on
        any rank; before every save and at each epoch's end (``where``: "by the end of
        epoch 2", ...). With several ranks (``all_reduce``: the sum over them) each rank
        puts the position of its first non-finite persistable in its own slot of one
        vector: the names are the same on every rank (one program), so every rank can
        name the rank and the tensor."""
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


def first_non_finite(program, names=None):
    """The name of the first floating-point persistable of ``program`` (of ``names``,
    sorted, where given) whose value in the global scope holds nan or inf, else None."""
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
    """Whether every element of ``value`` is finite: floating-point arrays, and bfloat16
    bits (uint16: nan and inf have all eight exponent bits set)."""
    if bfloat16 and value.dtype == np.uint16:
        return not ((value & 0x7F80) == 0x7F80).any()
    return value.dtype.kind != "f" or bool(np.isfinite(value).all())
