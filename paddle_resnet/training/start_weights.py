"""Where a run starts: ``--from-checkpoint auto`` resolved to this run's newest
checkpoint (the same on every rank), the start weights read and checked (a resumed
checkpoint belongs to this run, ``run_folder.py``), and once the programs are
prepared, loaded (resume, pretrained or none)."""

import dataclasses
import os
from typing import Any, List, Optional

import numpy as np

from paddle_resnet.core import provenance
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.data.folder import check_class_names
from paddle_resnet.models import model_entry
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import run_folder
from paddle_resnet.training.weights import (
    check_quantization,
    into_program,
    program_state,
    read_weights,
)


@dataclasses.dataclass
class Start:
    """The start weights chosen and checked before anything is built: ``config`` with
    --from-checkpoint auto resolved, the checkpoint's ``meta`` (None for other
    weights), the ``state`` read (None: the initialisation), whether training
    ``resumes`` the checkpoint's run, and the ``lines`` to print once the report is open."""

    config: Any
    meta: Optional[dict]
    state: Optional[dict]
    resumes: bool
    lines: List[str]


def choose(config, classes, training, rank, all_reduce):
    """The ``Start`` of this run, checked against its output folder and ``classes``."""
    config, lines = resolve_auto(config, rank, all_reduce)
    meta, state = read_weights(config.run)
    resumes = run_folder.continues_the_run(meta, config, training)
    check_start(config, meta, classes, training, resumes)
    if resumes and rank == 0 and not config.run.benchmark:
        lines += rewind(config, meta)
    if not training and state is not None:
        run_cfg = config.run
        check_quantization(
            meta, state, config, run_cfg.from_checkpoint or run_cfg.from_pretrained_params
        )
    return Start(config, meta, state, resumes, lines)


def resolve_auto(config, rank, all_reduce):
    """``config`` with --from-checkpoint auto replaced by the newest checkpoint of this
    run in <output-dir>/<arch> (at an epoch's end or within one), or by none when the
    folder holds none yet: what a scheduler restarting a job with the same command line
    needs. Rank 0 chooses, after finishing any save a killed process left, and the
    other ranks take its choice (an all-reduce where only rank 0 contributes). Returns
    (config, the lines to print: which start, and any damaged checkpoint skipped)."""
    run_cfg = config.run
    if run_cfg.from_checkpoint != ckpt.AUTO:
        return config, []
    folder = os.path.join(run_cfg.output_dir, config.model.arch)
    lines, choice = [], np.zeros(4)
    if rank == 0:
        newest = ckpt.newest_verified(folder, lines.append)
        if newest:
            choice[:3] = (*ckpt.progress_of(os.path.basename(newest)), 1)
    if all_reduce is not None:
        choice = all_reduce(choice)
    epochs_done, steps_done, found = (int(value) for value in choice[:3])
    if found:
        chosen = os.path.join(folder, ckpt.checkpoint_name(epochs_done, steps_done))
        lines.append(f"--from-checkpoint auto: {chosen}, the newest checkpoint of this run")
    elif run_cfg.run_scope == "eval_only":
        raise CheckpointError(f"--from-checkpoint auto: {folder} holds no checkpoint to evaluate")
    else:
        chosen = None
        lines.append(f"--from-checkpoint auto: no checkpoint in {folder} yet: a fresh start")
    run_cfg = dataclasses.replace(run_cfg, from_checkpoint=chosen)
    return dataclasses.replace(config, run=run_cfg), lines


def rewind(config, meta):
    """A resume from a checkpoint older than others in <output-dir>/<arch> (named, or
    the newest that verifies): the newer ones, a branch this run abandons, are moved
    aside under names neither --from-checkpoint auto nor retention takes; one line."""
    folder = os.path.join(config.run.output_dir, config.model.arch)
    moved = ckpt.set_aside_newer(folder, (meta["epoch"], meta.get("step_in_epoch", 0)))
    if not moved:
        return []
    return [
        f"rewound to {config.run.from_checkpoint}: the newer checkpoints "
        f"{', '.join(old for old, _ in moved)} moved aside as "
        f"{', '.join(new for _, new in moved)} (--from-checkpoint auto and "
        "--keep-checkpoints leave them alone; remove them once unneeded)"
    ]


def check_start(config, meta, classes, training, resuming):
    """Before anything is built or written: a resumed checkpoint must belong to this run,
    a fresh run must not mix its checkpoints with another's, and the data's class names
    must be the checkpoint's."""
    resuming = meta if resuming else None
    if resuming:
        run_folder.check_same_run(meta, config, config.run.from_checkpoint)
    if training and not config.run.benchmark:
        run_folder.check_output_free(config, resuming)
    if meta is not None:
        check_class_names(
            classes,
            meta["classes"],
            f"{config.data.image_root}",
            f"checkpoint {config.run.from_checkpoint}",
        )


def load(session, start):
    """Resume, or load pretrained weights, or keep the initialisation; returns where the
    training goes on: (epochs done, steps done in the next)."""
    config, programs, report = session.config, session.programs, session.report
    run_cfg, meta, state = config.run, start.meta, start.state
    world_size, steps_per_epoch = session.world_size, session.steps_per_epoch
    if state is None:
        return 0, 0
    if start.resumes:
        into_program.restore_state(programs.train, state)
        steps_done = meta.get("step_in_epoch", 0)
        if steps_done and meta.get("world_size", 1) != world_size:
            raise CheckpointError(
                f"{run_cfg.from_checkpoint}: saved in the middle of an epoch by "
                f"{meta.get('world_size', 1)} rank(s); it resumes on as many (each rank's "
                "share of the epoch would differ)"
            )
        # The LR schedule runs over epochs: continue at the same epoch, whatever the
        # number of steps an epoch now has (it changes with the world size).
        programs.lr_scheduler.step(meta["epoch"] * steps_per_epoch + steps_done)
        within = f", step {steps_done} of epoch {meta['epoch'] + 1}" if steps_done else ""
        report.print(f"resumed from {run_cfg.from_checkpoint} after epoch {meta['epoch']}{within}")
        other_code = provenance.difference(meta.get("code"))
        if other_code:
            report.print(other_code)
        saved_epochs = meta["config"]["run"]["epochs"]
        if saved_epochs != config.run.epochs:
            report.print(
                f"the checkpoint's run had {saved_epochs} epochs, this one has "
                f"{config.run.epochs}: the LR schedule now spans {config.run.epochs}"
            )
        saved_world = meta.get("world_size", 1)
        if saved_world != world_size:
            report.print(
                f"the checkpoint was trained by {saved_world} rank(s), this run has "
                f"{world_size}: {steps_per_epoch} steps per epoch, global batch "
                f"{config.data.batch_size * world_size} instead of "
                f"{config.data.batch_size * saved_world} (the LR follows linear scaling)"
            )
        return meta["epoch"], steps_done
    source = run_cfg.from_checkpoint or run_cfg.from_pretrained_params
    state, note = program_state(state, meta, programs.model, config, source)
    report.print(note)
    training = session.training
    if meta is not None and training:
        report.print(
            f"quantization-aware training starts from the weights of {source} "
            f"(epoch {meta['epoch']}, trained without --qat): new optimizer state "
            f"and LR schedule, {config.run.epochs} epoch(s)"
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
    for name in skipped:
        report.print(f"warning: pretrained parameter skipped: {name}")
    report.log("PRETRAINED", {"file": source, "skipped": skipped}, kind="PARAMETER", console=False)
    return 0, 0
