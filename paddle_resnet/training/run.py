"""One run of train.py, as plain functions over the built programs: open and check the
data, build the programs, load the start weights (``start_weights``), then
train epochs (save, validate), evaluate only, or measure throughput; the report and the
summary table. ``run(config, after_training)`` is what the train command calls."""

import contextlib
import itertools
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import paddle

from paddle_resnet.core import affinity, devices
from paddle_resnet.core.atomic import check_writable_folder, run_lock
from paddle_resnet.core.bootstrap import threads_per_process
from paddle_resnet.core.class_index import CLASSES_FILE, write_class_index
from paddle_resnet.core.metrics import latency_summary, time_steps
from paddle_resnet.core.report import Report
from paddle_resnet.data.dali import make_loader, open_split, train_steps
from paddle_resnet.data.folder import check_num_classes, check_same_classes
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import distributed, eval_predictor, ir, start_weights, stopping
from paddle_resnet.training import programs as program_builder
from paddle_resnet.training.loop import evaluate, mixup_weights, train_one_epoch, train_step
from paddle_resnet.training.profiling import step_profiler
from paddle_resnet.training.qat import quantize_eval_program
from paddle_resnet.training.sparsity import masks as sparse_masks
from paddle_resnet.training.weights import check_quantization, read_weights


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


@dataclass
class Session:
    """What the steps of one run share, built once by ``_run``: the programs and their
    executor, the report, and this process's place among the ranks."""

    config: Any
    exe: Any
    programs: Any
    report: Report
    rank: int
    world_size: int
    place: Any
    device_id: Optional[int]
    all_reduce: Optional[Callable]  # sums over the ranks (None with one rank)

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


def run(config, report_stream=None, after_training=None):
    """Run ``config.run.run_scope``; returns the final metrics (rank 0's view).
    ``after_training(config)``: rank 0's last step of a training run (the export of
    train.py --inference-dir), its {metric: value} added to the summary."""
    with distributed.launcher_stop_reported(), ir.selected(config):
        return _run(config, report_stream, after_training)


def _run(config, report_stream, after_training):
    run_cfg = config.run
    if run_cfg.run_scope != "eval_only":
        devices.check_training_options(config)
    rank, world_size = distributed.init_fleet()
    # One run per output folder, from before its checks to its last line (rank 0's
    # lock; the other ranks follow rank 0 or end with it).
    folder = f"--output-dir {run_cfg.output_dir}"
    if rank == 0:
        check_writable_folder(run_cfg.output_dir, "--output-dir")
    with run_lock(run_cfg.output_dir, folder) if rank == 0 else contextlib.nullcontext():
        return _run_in_folder(config, report_stream, after_training, rank, world_size)


def _run_in_folder(config, report_stream, after_training, rank, world_size):
    run_cfg, data_cfg = config.run, config.data
    training = run_cfg.run_scope != "eval_only"
    evaluating = run_cfg.run_scope != "train_only" and not run_cfg.benchmark
    place, device_id = devices.device()
    if run_cfg.cpu_affinity and device_id is not None:
        affinity.pin_to_gpu(device_id)
    all_reduce = distributed.all_reduce_sum(place) if world_size > 1 else None
    train_split, val_split, classes = open_data(config, training, evaluating)
    config, start_lines = start_weights.resolve_auto(config, rank, all_reduce)
    run_cfg = config.run
    meta, state = read_weights(run_cfg)
    resuming = ckpt.continues_the_run(meta, config, training)
    start_weights.check_start(config, meta, classes, training, resuming)
    if not training and state is not None:
        check_quantization(
            meta, state, config, run_cfg.from_checkpoint or run_cfg.from_pretrained_params
        )
    steps_per_epoch = (
        train_steps(len(train_split), data_cfg.batch_size, world_size) if training else None
    )
    programs = program_builder.build_programs(
        config, steps_per_epoch, data_cfg.batch_size * world_size, training=training
    )
    exe = paddle.static.Executor(place)
    exe.run(programs.startup)
    # PIR's O2 made its weights low precision as it was built (paddle.amp.decorate).
    if training and config.amp.enabled and config.amp.use_pure_fp16 and not ir.is_pir(config):
        program_builder.init_pure_fp16(programs, place)
    if config.qat.enabled and not ir.is_pir(config):  # PIR: quantized as it was built
        # Before any weights are loaded, so a QAT checkpoint's scales find their variables.
        quantize_eval_program(programs.eval, place)

    report = Report(
        config.report_file,
        enabled=rank == 0,
        stream=report_stream or sys.stdout,
        visualdl_dir=run_cfg.visualdl_log_dir,
    )
    for line in start_lines:
        report.print(line)
    with report:  # closed (its file, VisualDL's writer) however the run ends
        session = Session(
            config, exe, programs, report, rank, world_size, place, device_id, all_reduce
        )
        return _run_with_report(
            session,
            train_split,
            val_split,
            classes,
            steps_per_epoch,
            (meta, state, resuming),
            after_training,
        )


def _run_with_report(
    session, train_split, val_split, classes, steps_per_epoch, start, after_training
):
    config, report, programs = session.config, session.report, session.programs
    run_cfg = config.run
    training = run_cfg.run_scope != "eval_only"
    evaluating = run_cfg.run_scope != "train_only" and not run_cfg.benchmark
    meta, state, resuming = start
    report.log("PARAMETER", config.to_dict(), kind="PARAMETER", console=False)
    report.print(
        f"{config.model.arch}: {len(classes)} classes, rank {session.rank}/{session.world_size}, "
        f"{devices.describe(session.device_id)}"
    )
    start_epoch = start_weights.load(
        config,
        programs,
        training,
        report,
        session.world_size,
        steps_per_epoch,
        meta,
        state,
        resuming,
    )
    resumed_steps = meta.get("step_in_epoch", 0) if resuming else 0
    if config.asp.enabled and training:
        sparse_masks.prepare(
            programs,
            config.asp,
            report,
            resumed=start_epoch > 0 or resumed_steps > 0,
            place=session.place,
        )
    if session.rank == 0:
        write_class_index(os.path.join(run_cfg.output_dir, CLASSES_FILE), classes)

    fast = eval_predictor.usable(config, session.device_id is not None)

    def run_eval(epoch):
        loader = session.loader(val_split, training=False)
        predictor = (
            eval_predictor.EvalPredictor(programs, session.exe, threads_per_process())
            if fast
            else None
        )
        return evaluate(session.exe, programs, loader, epoch, report, session.all_reduce, predictor)

    metrics = {}
    with distributed.peers_watched(
        session.rank,
        session.world_size,
        os.path.join(run_cfg.output_dir, config.model.arch),
        run_cfg.collective_timeout,
    ):
        if not training:
            metrics.update(run_eval(evaluated_epoch(config, meta, report)))
        elif config.asp.prune_model and evaluating:
            # pruning's immediate cost, before retraining recovers it
            metrics.update(run_eval(start_epoch))
        if training and run_cfg.benchmark:
            metrics.update(benchmark(session, train_split))
        elif training:
            metrics = train_epochs(
                session,
                train_split,
                classes,
                (start_epoch, resumed_steps),
                steps_per_epoch,
                run_eval if evaluating else None,
            )
    if training and not run_cfg.benchmark and session.rank == 0 and after_training:
        metrics.update(after_training(config, report))
    report.log("SUMMARY", metrics, kind="SUMMARY", console=False)
    report.table("summary", summary_rows(config, metrics, session.world_size, session.device_id))
    return metrics


def evaluated_epoch(config, meta, report):
    """eval_only: which weights are evaluated, said on the console and in the report;
    returns the epoch they were saved after (0 for other weights)."""
    source = config.run.from_checkpoint or config.run.from_pretrained_params
    epoch = meta["epoch"] if meta else 0
    where = f"checkpoint {source} (epoch {epoch})" if meta else source or "the initial weights"
    report.print(f"evaluating {where}")
    report.log("EVALUATED", {"weights": source, "epoch": epoch}, kind="PARAMETER", console=False)
    return epoch


def train_epochs(session, train_split, classes, start, steps_per_epoch, run_eval):
    """From ``start`` (epochs done, steps done in the next) to ``run.epochs``: train,
    check that the ranks agree, verify sparsity, save, validate. Ctrl-C / SIGTERM stop
    the run after the step in flight (every rank after the same step), saved
    (``stopping.py``)."""
    config, programs, report = session.config, session.programs, session.report
    run_cfg, rank, world_size = config.run, session.rank, session.world_size
    metrics, history = {}, {"train.seconds": 0.0, "train.images": 0}
    profiler = step_profiler(run_cfg)
    start_epoch, skip = start
    with stopping.StopRequests(session.all_reduce) as stop:
        for epoch in range(start_epoch + 1, run_cfg.epochs + 1):
            metrics = train_one_epoch(
                session.exe,
                programs,
                session.loader(train_split, training=True, epoch=epoch - 1),
                epoch,
                report,
                run_cfg.print_interval,
                world_size,
                config.loss.mixup_alpha,
                config.data.seed,
                profiler,
                skip=skip if epoch == start_epoch + 1 else 0,
                stop=stop,
            )
            if stop.signal_number is not None:
                _save_stopped(
                    session, classes, epoch, metrics["train.steps"], steps_per_epoch, stop
                )
            last = epoch == run_cfg.epochs
            if session.all_reduce:
                checksum = distributed.check_ranks_agree(
                    programs.train, session.all_reduce, f"after epoch {epoch}"
                )
                report.log(
                    [epoch],
                    {"parameter_checksum": checksum, "world_size": world_size},
                    kind="RANKS",
                    console=False,
                )
            if config.asp.enabled:
                sparse_masks.verify(programs, report, where=f"epoch {epoch}")
            # Saved before validating, so that a broken validation image never costs the epoch.
            if rank == 0 and (epoch % run_cfg.save_interval == 0 or last):
                directory = ckpt.checkpoint_dir(run_cfg.output_dir, config.model.arch, epoch)
                _save(session, classes, directory, epoch, 0, steps_per_epoch)
            if run_eval and (epoch % run_cfg.eval_interval == 0 or last):
                metrics.update(run_eval(epoch))
                if metrics["val.top1"] > history.get("val.best_top1", -1.0):
                    history.update({"val.best_top1": metrics["val.top1"], "val.best_epoch": epoch})
            report.log([epoch], metrics, kind="EPOCH", console=False)
            history["train.seconds"] += metrics["train.seconds"]
            history["train.images"] += metrics["train.images"]
    profiler.close()  # a window that outlasted the training
    return dict(metrics, **{f"run.{key}": value for key, value in history.items()})


def _save(session, classes, directory, epochs_done, steps_done, steps_per_epoch):
    """A checkpoint after ``epochs_done`` epochs and ``steps_done`` steps of the next."""
    config = session.config
    ckpt.save_checkpoint(
        session.programs.train,
        directory,
        {
            "epoch": epochs_done,
            "step_in_epoch": steps_done,
            "global_step": epochs_done * steps_per_epoch + steps_done,
            "world_size": session.world_size,
            "arch": config.model.arch,
            "classes": list(classes),
            "config": config.to_dict(),
        },
        prefix=config.run.model_prefix,
    )
    session.report.print(f"saved {directory}")
    removed = ckpt.remove_superseded(os.path.dirname(directory), config.run.keep_checkpoints)
    if removed:
        session.report.print(
            f"removed older checkpoints (--keep-checkpoints): {', '.join(removed)}"
        )


def _save_stopped(session, classes, epoch, steps_done, steps_per_epoch, stop):
    """The checkpoint of a run stopped by a signal in ``epoch`` after ``steps_done``
    steps (``<arch>/<epoch>-step<k>``, by rank 0; the other ranks wait for it), each
    rank's one line, and the exit."""
    config, report, rank = session.config, session.report, session.rank
    epochs_done, within = (epoch - 1, steps_done) if steps_done < steps_per_epoch else (epoch, 0)
    name = ckpt.checkpoint_name(epochs_done, within)
    directory = os.path.join(config.run.output_dir, config.model.arch, name)
    if rank == 0:
        _save(session, classes, directory, epochs_done, within, steps_per_epoch)
    if session.all_reduce:  # no rank ends the job before the checkpoint is complete
        session.all_reduce(np.zeros(4))
    where = f"in epoch {epoch} after step {steps_done} of {steps_per_epoch}"
    line, code = stopping.stopped(stop.signal_number, where, directory)
    report.log(
        [epoch, steps_done],
        {"signal": stop.signal_number, "checkpoint": directory},
        kind="STOPPED",
        console=False,
    )
    if rank == 0:
        report.print(line)
        distributed.tell_launcher_console(line)
    else:  # this rank's log (the launcher's --log_dir) says it too
        print(f"rank {rank}: {line}", flush=True)
    raise SystemExit(code)


def benchmark(session, train_split):
    """Training throughput and step-time percentiles over ``benchmark_steps`` steps after
    ``benchmark_warmup_steps``; data loading counts in the step time."""
    config, world_size = session.config, session.world_size
    batches = itertools.chain.from_iterable(
        session.loader(train_split, training=True, epoch=epoch) for epoch in itertools.count()
    )
    weights = mixup_weights(config.loss.mixup_alpha, config.data.seed, 0)
    run_cfg = config.run
    seconds = time_steps(
        lambda: train_step(session.exe, session.programs, next(batches), next(weights)),
        run_cfg.benchmark_warmup_steps,
        run_cfg.benchmark_steps,
    )
    summary = latency_summary(config.data.batch_size * world_size, seconds)
    result = {
        "train.ips": summary["ips"],
        "train.batch_size": config.data.batch_size,
        "train.step_ms_mean": summary["latency_avg"],
        "train.step_ms_p50": summary["latency_p50"],
        "train.step_ms_p90": summary["latency_p90"],
        "world_size": world_size,
        "benchmark_steps": run_cfg.benchmark_steps,
        "benchmark_warmup_steps": run_cfg.benchmark_warmup_steps,
    }
    session.report.log("BENCHMARK", result, kind="SUMMARY")
    return result


def summary_rows(config, metrics, world_size, device_id):
    """The final table: what ran, the best and last accuracy, speed, where the files are."""
    device = "CPU" if device_id is None else "GPU"
    rows = [("model", f"{config.model.arch}, {world_size} {device} process(es)")]
    if "run.val.best_top1" in metrics:
        rows.append(
            (
                "best val top-1",
                f"{100 * metrics['run.val.best_top1']:.2f} % "
                f"(epoch {metrics['run.val.best_epoch']})",
            )
        )
    if "val.top1" in metrics:
        rows.append(
            (
                "last val top-1",
                f"{100 * metrics['val.top1']:.2f} % of {metrics['val.images']} images",
            )
        )
    if metrics.get("run.train.seconds"):
        seconds = metrics["run.train.seconds"]
        rows.append(
            (
                "training",
                f"{int(seconds // 60)} min {seconds % 60:.0f} s, "
                f"{metrics['run.train.images'] / seconds:.1f} img/s",
            )
        )
    if "train.ips" in metrics and "run.train.seconds" not in metrics:
        rows.append(("throughput", f"{metrics['train.ips']:.1f} img/s"))
    if metrics.get("run.train.images"):
        rows.append(("checkpoints", os.path.join(config.run.output_dir, config.model.arch)))
    rows.append(("report", config.report_file))
    return rows
