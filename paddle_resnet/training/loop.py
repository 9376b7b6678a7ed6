"""The step, the epoch and the evaluation pass: plain functions over a run's ``Session``
(the programs that ``programs.py`` builds, prepared by ``prepare.py``)."""

import time

import numpy as np

from paddle_resnet.core import feeds, watchdog
from paddle_resnet.core.metrics import (
    Meter,
    accuracy_from_counts,
    add_confusions,
    class_results,
    describe_class_results,
    eval_counts,
)
from paddle_resnet.training import divergence, eval_predictor
from paddle_resnet.training.profiling import NoProfiler


def _num_images(feed):
    label = feed[feeds.LABEL]
    return len(label) if isinstance(label, np.ndarray) else label.shape()[0]


def _memory_reason(err):
    """The line of an out-of-memory error that says what could not be allocated."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "memory" in line.lower()] or lines or ["out of memory"]
    return named[0].split(" (at /")[0]


def mixup_weights(alpha, seed, epoch):
    """Endless MixUp weights from Beta(alpha, alpha), seeded by (seed, epoch) so that a
    resumed run draws the same; None each step without MixUp."""
    rng = np.random.RandomState(seed + epoch)
    while True:
        yield np.array([rng.beta(alpha, alpha)], dtype=np.float32) if alpha > 0 else None


def train_step(exe, programs, feed, mixup_weight=None, class_feeds=None, fetches=None):
    """One batch through the train program, then the LR scheduler's step; the fetched
    values (and ``fetches``: {name: variable}) and lr as floats."""
    if programs.mixup_feed:
        feed = dict(feed, **{programs.mixup_feed: mixup_weight})
    if programs.class_feeds:
        feed = dict(feed, **{name: class_feeds[name] for name in programs.class_feeds})
    lr = programs.lr_scheduler.get_lr()
    fetched = dict(programs.train_fetches, **(fetches or {}))
    results = exe.run(programs.train, feed=feed, fetch_list=list(fetched.values()))
    watchdog.beat()
    programs.lr_scheduler.step()
    values = {name: float(np.mean(value)) for name, value in zip(fetched, results)}
    return dict(values, lr=lr)


class StepLog:
    """What a person and the trackers see of an epoch's steps: the progress bar, LOG
    records, a Kubeflow TrainJob's progress, the epoch's averages and timings."""

    def __init__(self, session, epoch, total):
        self.session, self.epoch, self.total = session, epoch, total
        # window: every step since the last logged line, whose means the line carries, so a
        # curve of the logged lines follows every step, not one batch in print_interval
        self.meter, self.window, self.timing = Meter(), Meter(), Meter()
        self.bar = session.report.progress(total, f"epoch {epoch}")
        self.epoch_start = self.tic = self.fed = time.perf_counter()

    def feeding(self):
        self.fed = time.perf_counter()

    def stepped(self, step, values, images):
        done = time.perf_counter()
        self.meter.update(values, images)
        self.window.update(values, images)
        fed, tic = self.fed, self.tic
        times = {"data_time": fed - tic, "compute_time": done - fed, "batch_time": done - tic}
        self.timing.update(times, 1)
        ips = images * self.session.world_size / times["batch_time"]
        self.bar.set_postfix_str(f"loss {values['loss']:.3f}, {ips:.0f} img/s", refresh=False)
        self.bar.update()
        if (step + 1) % self.session.config.run.print_interval == 0 or step + 1 == self.total:
            self._log(step, values, ips, times)
        self.tic = time.perf_counter()

    def _log(self, step, values, ips, times):
        session, epoch, total = self.session, self.epoch, self.total
        means = {f"{k}_mean": v for k, v in self.window.averages().items() if k != "lr"}
        session.report.log(
            [epoch, step + 1],
            dict(values, ips=ips, progress=f"{step + 1}/{total}", **times, **means),
            console=not session.report.interactive,
        )
        self.window = Meter()
        if session.trainer_status is not None:  # a Kubeflow TrainJob's progress
            session.trainer_status.post(
                (epoch - 1) * total + step + 1,
                session.config.run.epochs * total,
                epoch,
                {"loss": values["loss"], "ips": round(ips)},
            )

    def summary(self, steps):
        """The epoch's averages, with ``train.steps`` done."""
        self.bar.close()
        elapsed = time.perf_counter() - self.epoch_start
        images = self.meter.count * self.session.world_size
        summary = {f"train.{k}": v for k, v in self.meter.averages().items() if k != "lr"}
        summary.update({f"train.{k}": v for k, v in self.timing.averages().items()})
        summary.update({"train.ips": images / elapsed, "train.images": images})
        return dict(summary, **{"train.seconds": elapsed, "train.steps": steps})


def _stops_after(session, watch, stop, values, at):
    """Whether the pass ends after this step; a loss not finite on any rank raises
    ``errors.Diverged`` on every rank. ``at``: (epoch, steps done, steps)."""
    diverged = watch.step_diverged(values)
    stopping = stop.should_stop(diverged) if stop is not None else diverged
    ranks_diverged = stop.diverged if stop is not None else int(diverged)
    if ranks_diverged:  # every rank, at this step: nothing is saved
        epoch, steps, total = at
        record = dict(values, ranks=ranks_diverged)
        session.report.log([epoch, steps], record, kind="DIVERGED", console=False)
        where = f"in epoch {epoch} at step {steps} of {total}"
        raise watch.stop_at_step(values, where, (ranks_diverged, session.world_size))
    return stopping


def train_one_epoch(
    session, loader, epoch, profiler=NoProfiler(), skip=0, stop=None, save_within=None, watch=None
):
    """One pass of ``loader`` through the train program; the epoch's averages. The first
    ``skip`` batches are read but not trained on (a mid-epoch resume: the data and MixUp
    streams advance as they did); the pass ends once ``stop.should_stop()``; where
    ``stop.save_due``, ``save_within(epoch, steps done)`` saves within the epoch."""
    watch = watch or divergence.Watch(session.config, session.programs.train)
    weights = mixup_weights(session.config.loss.mixup_alpha, session.config.data.seed, epoch)
    class_feeds = session.class_feeds(epoch)
    total = len(loader)
    log = StepLog(session, epoch, total)
    done_steps = 0
    for step, feed in enumerate(loader):
        if step < skip:
            next(weights)
            log.bar.update()
            continue
        log.feeding()
        with profiler.step((epoch - 1) * total + step):
            values = train_step(
                session.exe, session.programs, feed, next(weights), class_feeds, watch.fetches
            )
        log.stepped(step, values, _num_images(feed))
        done_steps = step + 1
        if _stops_after(session, watch, stop, values, (epoch, done_steps, total)):
            break
        if stop is not None and stop.save_due and done_steps < total and save_within:
            save_within(epoch, done_steps)  # --save-every-minutes
    return log.summary(done_steps)


def evaluate(session, split, epoch):
    """Exact top-1 / top-k / loss and per-class results over every image of ``split``
    now; counts summed on the host (no padded images), then across ranks."""
    exe, programs, report = session.exe, session.programs, session.report
    loader = session.loader(split, training=False)
    fast = eval_predictor.usable(session.config, session.device_id is not None)
    predictor = eval_predictor.EvalPredictor(programs, exe) if fast else None
    fetch_list = [programs.eval_fetches["topk"], programs.eval_fetches["loss"]]
    program = programs.eval_compiled or programs.eval
    run = predictor or (lambda feed: exe.run(program, feed=feed, fetch_list=fetch_list))
    classes = session.classes
    totals, confusion = np.zeros(4), np.zeros((len(classes), len(classes)))
    start = time.perf_counter()
    bar = report.progress(len(loader), f"validation {epoch}")
    for batch, feed in enumerate(loader, 1):
        try:
            top_classes, losses = run(feed)
        except MemoryError as err:  # Paddle raises its ResourceExhaustedError as one
            raise MemoryError(
                f"the validation of epoch {epoch}, batch {batch} of {len(loader)} "
                f"({_num_images(feed)} images): {_memory_reason(err)}"
            ) from None
        labels = np.array(feed[feeds.LABEL])
        totals += eval_counts(top_classes, losses, labels)
        add_confusions(confusion, top_classes, labels)
        watchdog.beat()
        bar.update()
    bar.close()
    if session.all_reduce is not None:
        summed = session.all_reduce(np.concatenate([totals, confusion.ravel()]))
        totals, confusion = summed[:4], summed[4:].reshape(confusion.shape)
    result = accuracy_from_counts(totals, programs.eval_fetches["topk"].shape[-1], prefix="val.")
    per_class = class_results(confusion, classes)
    result["val.balanced_top1"] = per_class["balanced_top1"]
    result["val.seconds"] = time.perf_counter() - start
    report.log([epoch], result, kind="VAL")
    report.log([epoch], per_class, kind="CLASSES", console=False)
    for line in describe_class_results(per_class):
        report.print(line)
    return result
