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
    """Endless MixUp weights drawn from Beta(alpha, alpha), seeded by (seed, epoch) so that
    a resumed run draws the same ones; None each step when ``alpha`` is 0 (no MixUp)."""
    rng = np.random.RandomState(seed + epoch)
    while True:
        yield np.array([rng.beta(alpha, alpha)], dtype=np.float32) if alpha > 0 else None


def train_step(exe, programs, feed, mixup_weight=None, class_feeds=None, fetches=None):
    """One batch through the train program, then the LR scheduler's step; the fetched
    values (loss, top1, top-k, and ``fetches``: {name: variable}) and lr as floats.
    ``class_feeds``: the per-class vectors of the loss ({feed name: vector},
    ``class_weights.ClassBalance.feeds``), fed where the program takes them."""
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


def train_one_epoch(
    session,
    loader,
    epoch,
    profiler=NoProfiler(),
    skip=0,
    stop=None,
    save_within=None,
    watch=None,
):
    """One pass of ``loader`` through the train program; returns the epoch's averages,
    with ``train.steps`` done. ``profiler`` (profiling.step_profiler) wraps each step.
    The first ``skip`` batches are read but not trained on (a mid-epoch resume: the data
    and MixUp streams advance as they did); the pass ends early once
    ``stop.should_stop()`` (``lifecycle.StopRequests``: every rank at the same step),
    after the step in flight; where ``stop.save_due`` there, ``save_within(epoch, steps
    done)`` saves a checkpoint within the epoch (--save-every-minutes). A step whose loss
    is not finite raises ``errors.Diverged`` on every rank, after the step's LOG record
    and before any save (``watch``: ``divergence.Watch``, made here where not given)."""
    config, report, world_size = session.config, session.report, session.world_size
    print_interval = config.run.print_interval
    watch = watch or divergence.Watch(config, session.programs.train)
    weights = mixup_weights(config.loss.mixup_alpha, config.data.seed, epoch)
    class_feeds = session.class_feeds(epoch)
    # window: every step since the last logged line, whose means the line carries, so a
    # curve of the logged lines follows every step, not one batch in print_interval
    meter, window, timing = Meter(), Meter(), Meter()
    total = len(loader)
    bar = report.progress(total, f"epoch {epoch}")
    epoch_start = tic = time.perf_counter()
    done_steps = 0
    for step, feed in enumerate(loader):
        if step < skip:
            next(weights)
            bar.update()
            continue
        fed = time.perf_counter()
        with profiler.step((epoch - 1) * total + step):
            values = train_step(
                session.exe, session.programs, feed, next(weights), class_feeds, watch.fetches
            )
        done = time.perf_counter()
        images = _num_images(feed)
        meter.update(values, images)
        window.update(values, images)
        times = {"data_time": fed - tic, "compute_time": done - fed, "batch_time": done - tic}
        timing.update(times, 1)
        ips = images * world_size / times["batch_time"]
        bar.set_postfix_str(f"loss {values['loss']:.3f}, {ips:.0f} img/s", refresh=False)
        bar.update()
        if (step + 1) % print_interval == 0 or step + 1 == total:
            means = {f"{k}_mean": v for k, v in window.averages().items() if k != "lr"}
            report.log(
                [epoch, step + 1],
                dict(values, ips=ips, progress=f"{step + 1}/{total}", **times, **means),
                console=not report.interactive,
            )
            window = Meter()
            if session.trainer_status is not None:  # a Kubeflow TrainJob's progress
                session.trainer_status.post(
                    (epoch - 1) * total + step + 1,
                    config.run.epochs * total,
                    epoch,
                    {"loss": values["loss"], "ips": round(ips)},
                )
        tic = time.perf_counter()
        done_steps = step + 1
        diverged = watch.step_diverged(values)
        stopping = stop.should_stop(diverged) if stop is not None else diverged
        ranks_diverged = stop.diverged if stop is not None else int(diverged)
        if ranks_diverged:  # every rank, at this step: nothing is saved
            where = f"in epoch {epoch} at step {step + 1} of {total}"
            record = dict(values, ranks=ranks_diverged)
            report.log([epoch, step + 1], record, kind="DIVERGED", console=False)
            raise watch.stop_at_step(values, where, (ranks_diverged, world_size))
        if stopping:
            break
        if stop is not None and stop.save_due and step + 1 < total and save_within:
            save_within(epoch, step + 1)  # --save-every-minutes
    bar.close()
    elapsed = time.perf_counter() - epoch_start
    summary = {f"train.{k}": v for k, v in meter.averages().items() if k != "lr"}
    summary.update({f"train.{k}": v for k, v in timing.averages().items()})
    summary["train.ips"] = meter.count * world_size / elapsed
    summary["train.images"] = meter.count * world_size
    summary["train.seconds"] = elapsed
    summary["train.steps"] = done_steps
    return summary


def evaluate(session, split, epoch):
    """Exact top-1 / top-k / loss and per-class results (the report's CLASSES record)
    over every image of ``split`` at the weights of this moment, by a predictor built
    from the eval program where one serves (``eval_predictor.usable``), else by the
    executor.

    Counts and the confusion matrix are summed on the host (the loader cuts the padded
    last batch), then across ranks when there are several.
    """
    exe, programs, report = session.exe, session.programs, session.report
    loader = session.loader(split, training=False)
    fast = eval_predictor.usable(session.config, session.device_id is not None)
    predictor = eval_predictor.EvalPredictor(programs, exe) if fast else None
    fetch_list = [programs.eval_fetches["topk"], programs.eval_fetches["loss"]]
    run = predictor or (
        lambda feed: exe.run(
            programs.eval_compiled or programs.eval, feed=feed, fetch_list=fetch_list
        )
    )
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
