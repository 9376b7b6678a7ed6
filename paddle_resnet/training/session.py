"""One run's state (``Session``): its start resolved, then its prepared programs,
executor and report, and where the work goes on."""

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

from paddle_resnet.core.report import Report
from paddle_resnet.data.dali import make_loader
from paddle_resnet.training.programs import Programs


@dataclass(kw_only=True)
class Session:
    """Resolved once by ``run.resolve_start`` (what everything after reads: ``config`` is
    the final one), given its programs and report by ``run.prepare_session``; the epochs,
    the benchmark and the evaluation read it instead of a dozen parameters each."""

    config: Any
    rank: int
    world_size: int
    place: Any
    device_id: Optional[int]
    all_reduce: Optional[Callable]  # sums over the ranks (None with one rank)
    classes: Sequence[str]
    steps_per_epoch: Optional[int]  # None when the run does not train
    start: Any = None  # start_weights.Start: the start weights read and checked, their lines
    train_split: Any = None
    val_split: Any = None
    screening: Any = None  # screening.Screening, or None (record files)
    kernels: Any = None  # cpu_kernels.Choice, or None where the run does not train
    fused_line: Optional[str] = None  # what cpu_ops.resolved said, or None
    # the per-class vectors of the loss (class_weights.ClassBalance), None for the plain loss
    class_balance: Optional[Any] = None
    # the run folder's checkpoints and their policy (run_folder.Checkpoints): retention
    checkpoints: Optional[Any] = None
    # once prepared (``run.prepare_session``)
    exe: Any = None
    programs: Optional[Programs] = None
    report: Optional[Report] = None
    # where the work goes on: (epochs done, steps done in the next), once weights are in
    progress: Tuple[int, int] = (0, 0)
    # rank 0's poster of progress to a Kubeflow TrainJob's status (trainer_status), or None
    trainer_status: Optional[Any] = None

    @property
    def training(self):
        """Whether the run trains (eval_only builds no train program)."""
        return self.config.run.run_scope != "eval_only"

    def class_feeds(self, epoch):
        """{feed name: vector} of the loss's per-class inputs in epoch ``epoch`` (1-based)."""
        return self.class_balance.feeds(epoch) if self.class_balance else {}

    def loader(self, split, training, epoch=0):
        """This rank's loader of ``split`` for one epoch (training) or one pass."""
        return make_loader(
            split,
            self.config.data,
            self.config.model.data_layout,
            training,
            self.rank,
            self.world_size,
            epoch,
            self.device_id,
            self.config.model.image_channels,
        )
