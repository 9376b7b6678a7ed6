"""The epochs of a training run: train, check that the ranks agree, verify sparsity, save
(``run_folder.Saves``), validate; and the stop that Ctrl-C or SIGTERM asks for."""

import contextlib
import json
import os

import numpy as np

from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import distributed, divergence, lifecycle, run_folder
from paddle_resnet.training.loop import evaluate, train_one_epoch
from paddle_resnet.training.profiling import step_profiler
from paddle_resnet.training.sparsity import masks as sparse_masks
from paddle_resnet.training.weights import into_program


def train_epochs(session, train_split, val_split, start):
    """From ``start`` (epochs done, steps done in the next) to ``run.epochs``, validating
    on ``val_split`` unless None; the last epoch's metrics and the run's (``run.*``)."""
    config, programs, report = session.config, session.programs, session.report
    run_cfg = config.run
    metrics, history = {}, {"train.seconds": 0.0, "train.images": 0}
    start_epoch, skip = start
    validated = False  # this start's first validation: a lost one of ``start`` comes first
    # the checkpoint this run resumed from was refused at load had it held nan or inf
    watch = divergence.Watch(
        config,
        programs.train,
        resumed_from=run_cfg.from_checkpoint,
        all_reduce=session.all_reduce,
        rank=session.rank,
        world_size=session.world_size,
    )
    saves = run_folder.Saves(session, start, watch)
    # closed however the epochs end: a window that outlasted the training, or a stop
    agreement = lifecycle.StepAgreement(session.all_reduce, saves.clock_says_save)
    with contextlib.closing(step_profiler(run_cfg)) as profiler, agreement as stop:
        for epoch in range(start_epoch + 1, run_cfg.epochs + 1):
            metrics = train_one_epoch(
                session,
                session.loader(train_split, training=True, epoch=epoch - 1),
                epoch,
                profiler,
                skip=skip if epoch == start_epoch + 1 else 0,
                stop=stop,
                save_within=saves.timed,
                watch=watch,
            )
            if stop.signal_number is not None:
                _stopped(session, saves, epoch, metrics["train.steps"], stop)
            # the job's decision (each rank's BN statistics are its own): before the save, and
            # where none is due
            watch.check_weights(f"by the end of epoch {epoch}")
            last = epoch == run_cfg.epochs
            if session.all_reduce:
                where = f"after epoch {epoch}"
                checksum = distributed.check_ranks_agree(programs.train, session.all_reduce, where)
                record = {"parameter_checksum": checksum, "world_size": session.world_size}
                report.log([epoch], record, kind="RANKS", console=False)
            if config.asp.enabled:
                sparse_masks.verify(programs, report, where=f"epoch {epoch}")
            # Saved before validating, so that a broken validation image never costs the epoch.
            if saves.due_at_epoch_end(epoch):
                saves.save(epoch, 0)
            if val_split is not None and (epoch % run_cfg.eval_interval == 0 or last):
                validated = validated or _revalidate(session, val_split, start, history)
                metrics.update(evaluate(session, val_split, epoch))
                if metrics["val.top1"] > history.get("val.best_top1", -1.0):
                    history.update({"val.best_top1": metrics["val.top1"], "val.best_epoch": epoch})
            report.log([epoch], metrics, kind="EPOCH", console=False)
            history["train.seconds"] += metrics["train.seconds"]
            history["train.images"] += metrics["train.images"]
    if val_split is not None and not validated:  # no epoch left to train: nothing to disturb
        _revalidate(session, val_split, start, history)
    return dict(metrics, **{f"run.{key}": value for key, value in history.items()})


def _revalidate(session, val_split, start, history):
    """At this start's first validation: the one of ``start``'s epoch an earlier start
    lost, where it did, on the checkpoint's weights (then the current ones put back,
    exactly): not before the first step, where an evaluation changed how the later steps
    round (2-rank resumes departed by 4e-9). True."""
    if not _validation_lost(session, start):
        return True
    epoch = start[0]
    config, programs, report = session.config, session.programs, session.report
    report.print(
        f"validating epoch {epoch} now: {config.report_file} holds no validation of it "
        "(the start that saved its checkpoint ended before or during it, e.g. out of memory)"
    )
    current = into_program.current_state(programs.train)
    into_program.restore_state(programs.train, ckpt.read_checkpoint(config.run.from_checkpoint)[1])
    try:
        metrics = evaluate(session, val_split, epoch)
    finally:
        into_program.restore_state(programs.train, current)
    report.log([epoch], metrics, kind="EPOCH", console=False)
    history.update({"val.best_top1": metrics["val.top1"], "val.best_epoch": epoch})
    return True


def _validation_lost(session, start):
    """Whether the epoch's checkpoint this run starts from was due a validation the report
    lacks: each epoch is saved before it is validated, so a start that ended in the
    validation left a checkpoint whose resume went on (a job requeued once per epoch
    could end with no validation figure). Rank 0 reads its report; one all-reduce."""
    epochs_done, steps_done = start
    config = session.config
    run_cfg = config.run
    # a checkpoint of this output folder: one resumed from elsewhere was validated there
    own = run_cfg.from_checkpoint and os.path.dirname(
        os.path.abspath(run_cfg.from_checkpoint)
    ) == os.path.abspath(run_folder.arch_folder(run_cfg.output_dir, config.model.arch))
    due = (
        own
        and steps_done == 0
        and epochs_done > 0
        and (epochs_done % run_cfg.eval_interval == 0 or epochs_done == run_cfg.epochs)
    )
    if not due:  # the same on every rank
        return False
    lost = session.rank == 0 and epochs_done not in _validated_epochs(config.report_file)
    if session.all_reduce:
        return bool(session.all_reduce(np.array([lost, 0.0, 0.0, 0.0]))[0])
    return lost


def _validated_epochs(report_file):
    """The epochs of ``report_file``'s VAL records (a half-written line skipped)."""
    epochs = set()
    if not os.path.exists(report_file):
        return epochs
    with open(report_file) as handle:
        for line in handle:
            if '"VAL"' not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("type") == "VAL":
                    epochs.add(record["step"][0])
    return epochs


def _stopped(session, saves, epoch, steps_done, stop):
    """A stop by a signal: its checkpoint, each rank's line, ``lifecycle.Stopped``."""
    report, rank, steps_per_epoch = session.report, session.rank, session.steps_per_epoch
    directory = saves.stopped(epoch, steps_done)
    where = f"in epoch {epoch} after step {steps_done} of {steps_per_epoch}"
    line, code = lifecycle.stopped(stop.signal_number, where, directory)
    record = {"signal": stop.signal_number, "checkpoint": directory}
    report.log([epoch, steps_done], record, kind="STOPPED", console=False)
    if rank == 0:
        report.print(line)
        lifecycle.tell_launcher_console(line)
    else:  # this rank's log (the launcher's --log_dir) says it too
        print(f"rank {rank}: {line}", flush=True)
    raise lifecycle.Stopped(line, code)
