"""Where a run starts: ``--from-checkpoint auto`` resolved, the start weights read and
checked, and once the programs are prepared, loaded (resume, pretrained or none).
Training, evaluation and export take their weights through ``read`` and ``load_into``."""

import dataclasses
import os
from typing import Any, List, Optional, Tuple

from paddle_resnet.core import provenance
from paddle_resnet.core.class_index import CLASSES_FILE, read_class_index
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.data.folder import check_class_names
from paddle_resnet.models import model_entry
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import run_folder
from paddle_resnet.training.weights import (
    check_quantization,
    into_program,
    pretrained_file,
    program_state,
    read_weights,
)


@dataclasses.dataclass
class Start:
    """The start weights chosen and checked before anything is built (``meta``: None for
    other weights than a checkpoint; ``state``: None for the initialisation)."""

    config: Any
    meta: Optional[dict]
    state: Optional[dict]
    resumes: bool
    lines: List[str]


def choose(config, classes, training, checkpoints, rank=0, share=None):
    """The ``Start`` of this run, checked against its output folder and ``classes``;
    ``share`` gives rank 0's decisions to every rank."""
    config, lines = run_folder.resolve_auto(config, checkpoints, rank, share)
    start = read(config, classes, training, lines)
    if start.resumes and rank == 0 and not config.run.benchmark:
        start.lines += run_folder.rewind(config, checkpoints, start.meta)
    return start


def read(config, classes, training, lines=()):
    """The ``Start`` of the weights ``config`` names, checked against ``classes`` (None:
    no data); evaluation and export take them as trained (``check_quantization``)."""
    meta, state = read_weights(config.run)
    resumes = run_folder.continues_the_run(meta, config, training)
    check_start(config, meta, classes, training, resumes)
    if not training and state is not None:
        check_quantization(meta, state, config, source_of(config))
    return Start(config, meta, state, resumes, list(lines))


def source_of(config):
    """The file or folder the start weights come from (None: the initialisation)."""
    return config.run.from_checkpoint or config.run.from_pretrained_params


def class_names(start):
    """The class names of the start weights: the checkpoint's, a classes.json beside
    them, or the label numbers."""
    if start.meta is not None:
        return start.meta["classes"]
    config = start.config
    weights_file = pretrained_file(config.run)
    index = os.path.join(os.path.dirname(os.path.abspath(weights_file)), CLASSES_FILE)
    return (
        ckpt.classes_beside(weights_file)
        or (read_class_index(index) if os.path.exists(index) else None)
        or [str(i) for i in range(config.model.num_classes)]
    )


def check_start(config, meta, classes, training, resuming):
    """Before anything is built: a resumed checkpoint belongs to this run, a fresh run
    mixes no checkpoints with another's, the data's class names are the checkpoint's."""
    resuming = meta if resuming else None
    if resuming:
        run_folder.check_same_run(meta, config, config.run.from_checkpoint)
    if training and not config.run.benchmark:
        run_folder.check_output_free(config, resuming)
    if meta is not None and classes is not None:
        where = f"checkpoint {config.run.from_checkpoint}"
        check_class_names(classes, meta["classes"], f"{config.data.image_root}", where)


def load(session, start):
    """``load_into`` said in the run's report; (epochs done, steps done in the next)."""
    report = session.report
    loaded = load_into(session.programs, start, session.world_size, session.steps_per_epoch)
    for line in loaded.lines:
        report.print(line)
    if loaded.pretrained is not None:
        report.log("PRETRAINED", loaded.pretrained, kind="PARAMETER", console=False)
    return loaded.progress


@dataclasses.dataclass
class Loaded:
    """What ``load_into`` did: where training goes on, its lines, and for pretrained
    weights the report's record."""

    progress: Tuple[int, int]
    lines: List[str]
    pretrained: Optional[dict] = None


def load_into(programs, start, world_size=1, steps_per_epoch=None):
    """``start``'s weights into the prepared ``programs``: resumed, pretrained or none."""
    config, meta, state = start.config, start.meta, start.state
    run_cfg = config.run
    if state is None:
        return Loaded((0, 0), [])
    if start.resumes:
        return _resume(programs, start, world_size, steps_per_epoch)
    source = source_of(config)
    state, note = program_state(state, meta, programs.model, config, source)
    lines = [note]
    training = programs.train is not None
    if meta is not None and training:
        lines.append(
            f"quantization-aware training starts from the weights of {source} "
            f"(epoch {meta['epoch']}, trained without --qat): new optimizer state "
            f"and LR schedule, {run_cfg.epochs} epoch(s)"
        )
    # Training may start with a new classifier; evaluation needs every weight. A 2:4
    # model brings its masks, unless this run prunes anew.
    family = model_entry(config.model.arch).family
    classifier = family.classifier_parameters(programs.model) if training else ()
    skipped = into_program.load_pretrained(
        programs.train if training else programs.eval,
        state,
        source,
        config.model.arch,
        may_skip=classifier,
        masks=config.asp.enabled and not config.asp.prune_model,
    )
    lines += [f"warning: pretrained parameter skipped: {name}" for name in skipped]
    return Loaded((0, 0), lines, {"file": source, "skipped": skipped})


def _resume(programs, start, world_size, steps_per_epoch):
    """A checkpoint of this run restored, the LR schedule at its step."""
    config, meta = start.config, start.meta
    run_cfg = config.run
    into_program.restore_state(programs.train, start.state)
    steps_done = meta.get("step_in_epoch", 0)
    saved_world = meta.get("world_size", 1)
    if steps_done and saved_world != world_size:
        raise CheckpointError(
            f"{run_cfg.from_checkpoint}: saved in the middle of an epoch by "
            f"{saved_world} rank(s); it resumes on as many (each rank's "
            "share of the epoch would differ)"
        )
    # The LR schedule runs over epochs: continue at the same epoch, whatever the
    # number of steps an epoch now has (it changes with the world size).
    programs.lr_scheduler.step(meta["epoch"] * steps_per_epoch + steps_done)
    within = f", step {steps_done} of epoch {meta['epoch'] + 1}" if steps_done else ""
    lines = [f"resumed from {run_cfg.from_checkpoint} after epoch {meta['epoch']}{within}"]
    other_code = provenance.difference(meta.get("code"))
    if other_code:
        lines.append(other_code)
    saved_epochs = meta["config"]["run"]["epochs"]
    if saved_epochs != run_cfg.epochs:
        lines.append(
            f"the checkpoint's run had {saved_epochs} epochs, this one has "
            f"{run_cfg.epochs}: the LR schedule now spans {run_cfg.epochs}"
        )
    if saved_world != world_size:
        lines.append(
            f"the checkpoint was trained by {saved_world} rank(s), this run has "
            f"{world_size}: {steps_per_epoch} steps per epoch, global batch "
            f"{config.data.batch_size * world_size} instead of "
            f"{config.data.batch_size * saved_world} (the LR follows linear scaling)"
        )
    return Loaded((meta["epoch"], steps_done), lines)
