"""One run of train.py, told as one story in numbered steps (``run``, what the train
command calls): the ranks meet, the output folder is claimed, the start resolved into one
final config, the programs prepared and the weights loaded; then evaluate, benchmark or
train the epochs; last, the summary."""

import contextlib
import os
import sys

from paddle_resnet.core import affinity, bootstrap, devices, trackers
from paddle_resnet.core.class_index import CLASSES_FILE, write_class_index
from paddle_resnet.core.report import Report
from paddle_resnet.core.trainer_status import TrainerStatus
from paddle_resnet.data.dali import open_split, train_steps
from paddle_resnet.data.folder import check_num_classes, check_same_classes
from paddle_resnet.data.screening import screened
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import (
    class_weights,
    cpu_kernels,
    cpu_ops,
    distributed,
    ir,
    lifecycle,
    onednn,
    prepare,
    run_folder,
    start_weights,
)
from paddle_resnet.training.benchmark import benchmark
from paddle_resnet.training.epochs import train_epochs
from paddle_resnet.training.loop import evaluate
from paddle_resnet.training.rendezvous import Rendezvous
from paddle_resnet.training.session import Session


def run(config, report_stream=None, after_training=None):
    """Run ``config.run.run_scope``; the final metrics (rank 0's view).
    ``after_training(config, report)``: rank 0's last step of a training run (the export
    of --inference-dir), its {metric: value} added to the summary."""
    with contextlib.ExitStack() as steps:
        guard = steps.enter_context(lifecycle.guarded(config.run.start_timeout))
        stops = steps.enter_context(lifecycle.stops_reported())
        steps.enter_context(ir.selected(config))
        if config.run.run_scope != "eval_only":
            devices.check_training_options(config)
        guard.phase("rendezvous of the ranks")
        rank, world_size = distributed.init_fleet()
        meeting = stops.met(Rendezvous.of_job(rank, world_size))
        with meeting.start():
            guard.phase("output folder lock")
            # one run per output folder, from before its checks to its last line
            steps.enter_context(run_folder.claimed(config.run.output_dir, rank))
            session = resolve_start(config, rank, world_size, meeting.share, guard)
            prepare_session(session, steps, guard, meeting, report_stream)
        guard.started()
        config, report = session.config, session.report
        with lifecycle.peers_watched(
            rank,
            world_size,
            session.checkpoints.folder,
            config.run.collective_timeout,
            roll_call=meeting.roll_call,
        ):
            metrics = work(session)
        if session.training and not config.run.benchmark and rank == 0 and after_training:
            metrics.update(after_training(config, report))
        report.log("SUMMARY", metrics, kind="SUMMARY", console=False)
        report.table("summary", summary_rows(config, metrics, world_size, session.device_id))
        return metrics


def resolve_start(config, rank, world_size, share, guard):
    """Once the run owns its folder: the data opened, the start weights chosen and
    checked, the tree screened, the CPU kernels decided: the run's ``Session``."""
    training = config.run.run_scope != "eval_only"
    evaluating = config.run.run_scope != "train_only" and not config.run.benchmark
    place, device_id, all_reduce = this_process(config.run, world_size)
    guard.phase("data")
    train_split, val_split, classes = open_data(config, training, evaluating)
    balance = class_weights.for_run(config, train_split) if training else None
    guard.phase("start weights")
    folder = run_folder.arch_folder(config.run.output_dir, config.model.arch)
    checkpoints = run_folder.Checkpoints(folder)
    start = start_weights.choose(config, classes, training, checkpoints, rank, share)
    guard.phase("data check")  # after the quick refusals: ImageNet has 1.3 M headers
    screening, train_split, val_split = screened(start.config, train_split, val_split, rank, share)
    guard.phase("CPU kernels")
    final, kernels, fused_line = start.config, None, None
    if training:
        final, fused_line = cpu_ops.resolved(final, world_size)
        final, kernels = cpu_kernels.resolved(final, world_size)
    steps_per_epoch = (
        train_steps(len(train_split), final.data.batch_size, world_size) if training else None
    )
    return Session(
        config=final, rank=rank, world_size=world_size, place=place, device_id=device_id,
        all_reduce=all_reduce, start=start, train_split=train_split, val_split=val_split,
        classes=classes, screening=screening, kernels=kernels, fused_line=fused_line,
        steps_per_epoch=steps_per_epoch,
        class_balance=balance, checkpoints=checkpoints,
    )  # fmt: skip


def prepare_session(session, steps, guard, meeting, report_stream):
    """The programs built and run (on GPUs the startup program makes NCCL's rings, so the
    ranks meet first), the report opened, the first lines, the start weights loaded, 2:4
    masks, classes.json; the ranks agree to take their first step."""
    config, rank = session.config, session.rank
    guard.phase("programs")
    meeting.agree("programs")
    session.programs, session.exe = prepare.ready_for_weights(
        config, session.training, session.world_size, session.steps_per_epoch, session.place
    )
    guard.phase("weights")
    session.report = steps.enter_context(open_report(config, rank, report_stream))
    if rank == 0:  # the statuses of several ranks would overwrite each other
        session.trainer_status = TrainerStatus.from_environment(report=session.report.print)
    introduce(session)
    session.progress = start_weights.load(session, session.start)
    prepare.prune(session, session.progress)
    if rank == 0:
        write_class_index(os.path.join(config.run.output_dir, CLASSES_FILE), session.classes)
    meeting.agree("steps")
    return session


def this_process(run_cfg, world_size):
    """(place, GPU id or None, the sum over the ranks or None); --cpu-affinity pins."""
    place, device_id = devices.device()
    if run_cfg.cpu_affinity and device_id is not None:
        affinity.pin_to_gpu(device_id)
    return place, device_id, distributed.all_reduce_sum(place) if world_size > 1 else None


def open_data(config, training, evaluating):
    """(train split, val split, class names), checked against each other and the model."""
    train_split = open_split(config.data, "train") if training else None
    val_split = open_split(config.data, "val") if evaluating else None
    if train_split and val_split:
        check_same_classes(train_split, val_split)
    for split in (train_split, val_split):
        if split:
            check_num_classes(
                split, config.model.num_classes, f"{config.data.image_root}/{split.split}"
            )
    return train_split, val_split, (train_split or val_split).classes


def open_report(config, rank, stream):
    """The run's report: rank 0's file, console and experiment trackers (a run from a
    checkpoint continuing theirs at its global step)."""
    run_cfg = config.run
    if rank != 0:
        return Report(config.report_file, enabled=False, stream=stream or sys.stdout)
    saved = ckpt.verify_checkpoint(run_cfg.from_checkpoint)[1] if run_cfg.from_checkpoint else None
    return Report(
        config.report_file,
        stream=stream or sys.stdout,
        trackers=trackers.opened(
            run_cfg.trackers,
            run_cfg.output_dir,
            run_cfg.tensorboard_log_dir,
            run_cfg.mlflow_tracking_uri,
            run_cfg.visualdl_log_dir,
            saved_step=saved["global_step"] if saved else None,
            trains=run_cfg.run_scope != "eval_only",
        ),
    )


def introduce(session):
    """The first lines of a run, and its parameters and findings in the report."""
    report, config = session.report, session.config
    kernels, screening = session.kernels, session.screening
    report.print(bootstrap.allocator_note())
    for line in session.start.lines:
        report.print(line)
    parameters = dict(config.to_dict(), ir=ir.record(config), allocator=bootstrap.allocator())
    if kernels:
        parameters["cpu_kernels"] = kernels.record()
    if kernels and kernels.how != "pinned":  # a pin is the environment's own word
        report.print(kernels.line())
    if session.fused_line:
        report.print(session.fused_line)
    report.log("PARAMETER", parameters, kind="PARAMETER", console=False)
    balance = session.class_balance
    if balance is not None:
        for step, vector in (
            ("CLASS_WEIGHTS", balance.weights),
            ("LOGIT_OFFSETS", balance.logit_offsets),
        ):
            if vector is not None:
                record = dict(zip(session.classes, map(float, vector)))
                report.log(step, record, kind="PARAMETER", console=False)
        for line in balance.describe(config.loss, session.classes):
            report.print(line)
    for note in (ir.legacy_note(config), onednn.bf16_note(config)):
        if note:
            report.print(note)
    report.print(
        f"{config.model.arch}: {len(session.classes)} classes, "
        f"rank {session.rank}/{session.world_size}, {devices.describe(session.device_id)}, "
        f"{ir.label(config)}"
    )
    if screening and screening.record:
        for line in screening.lines:
            report.print(line)
        report.log("DATA_CHECK", screening.record, kind="DATA_CHECK", console=False)


def work(session):
    """Evaluate the start weights, measure throughput, or train the epochs; the metrics."""
    config, report, progress = session.config, session.report, session.progress
    train_split, val_split = session.train_split, session.val_split
    if not session.training:
        epoch = evaluated_epoch(config, session.start.meta, report)
        return evaluate(session, val_split, epoch)
    metrics = {}
    if config.asp.prune_model and val_split is not None:
        # pruning's immediate cost, before retraining recovers it
        metrics.update(evaluate(session, val_split, progress[0]))
    if config.run.benchmark:
        return dict(metrics, **benchmark(session, train_split))
    return train_epochs(session, train_split, val_split, progress)


def evaluated_epoch(config, meta, report):
    """eval_only: which weights are evaluated, said; the epoch they were saved after."""
    source = config.run.from_checkpoint or config.run.from_pretrained_params
    epoch = meta["epoch"] if meta else 0
    where = f"checkpoint {source} (epoch {epoch})" if meta else source or "the initial weights"
    report.print(f"evaluating {where}")
    report.log("EVALUATED", {"weights": source, "epoch": epoch}, kind="PARAMETER", console=False)
    return epoch


def summary_rows(config, metrics, world_size, device_id):
    device = "CPU" if device_id is None else "GPU"
    rows = [("model", f"{config.model.arch}, {world_size} {device} process(es)")]
    if "run.val.best_top1" in metrics:
        best, epoch = metrics["run.val.best_top1"], metrics["run.val.best_epoch"]
        rows.append(("best val top-1", f"{100 * best:.2f} % (epoch {epoch})"))
    if "val.top1" in metrics:
        top1, balanced = 100 * metrics["val.top1"], 100 * metrics["val.balanced_top1"]
        images = metrics["val.images"]
        last = f"{top1:.2f} % of {images} images (balanced over classes: {balanced:.2f} %)"
        rows.append(("last val top-1", last))
    seconds = metrics.get("run.train.seconds")
    if seconds:
        took = f"{int(seconds // 60)} min {seconds % 60:.0f} s"
        rows.append(("training", f"{took}, {metrics['run.train.images'] / seconds:.1f} img/s"))
    if "train.ips" in metrics and "run.train.seconds" not in metrics:
        rows.append(("throughput", f"{metrics['train.ips']:.1f} img/s"))
    if metrics.get("run.train.images"):
        folder = run_folder.arch_folder(config.run.output_dir, config.model.arch)
        rows.append(("checkpoints", folder))
    rows.append(("report", config.report_file))
    return rows
