"""The training loop: plain functions over the programs that ``program.py`` builds."""

import time

import numpy as np

from paddle_resnet.core import feeds, watchdog
from paddle_resnet.core.metrics import Meter, accuracy_from_counts, eval_counts
from paddle_resnet.training.profiling import NoProfiler


def _num_images(feed):
    label = feed[feeds.LABEL]
    return len(label) if isinstance(label, np.ndarray) else label.shape()[0]


def mixup_weights(alpha, seed, epoch):
    """Endless MixUp weights drawn from Beta(alpha, alpha), seeded by (seed, epoch) so that
    a resumed run draws the same ones; None each step when ``alpha`` is 0 (no MixUp)."""
    rng = np.random.RandomState(seed + epoch)
    while True:
        yield np.array([rng.beta(alpha, alpha)], dtype=np.float32) if alpha > 0 else None


def train_step(exe, programs, feed, mixup_weight=None):
    """One batch through the train program, then the LR scheduler's step; the fetched
    values (loss, top1, top-k, lr) as floats."""
    if programs.mixup_feed:
        feed = dict(feed, **{programs.mixup_feed: mixup_weight})
    lr = programs.lr_scheduler.get_lr()
    results = exe.run(programs.train, feed=feed, fetch_list=list(programs.train_fetches.values()))
    watchdog.beat()
    programs.lr_scheduler.step()
    values = {name: float(np.mean(value)) for name, value in zip(programs.train_fetches, results)}
    return dict(values, lr=lr)


def train_one_epoch(
    exe,
    programs,
    loader,
    epoch,
    report,
    print_interval,
    world_size=1,
    mixup_alpha=0.0,
    seed=0,
    profiler=NoProfiler(),
):
    """One pass of ``loader`` through the train program; returns the epoch's averages.
    ``profiler`` (profiling.step_profiler) wraps each step."""
    weights = mixup_weights(mixup_alpha, seed, epoch)
    meter, timing = Meter(), Meter()
    total = len(loader)
    bar = report.progress(total, f"epoch {epoch}")
    epoch_start = tic = time.perf_counter()
    for step, feed in enumerate(loader):
        fed = time.perf_counter()
        with profiler.step((epoch - 1) * total + step):
            values = train_step(exe, programs, feed, next(weights))
        done = time.perf_counter()
        images = _num_images(feed)
        meter.update(values, images)
        times = {"data_time": fed - tic, "compute_time": done - fed, "batch_time": done - tic}
        timing.update(times, 1)
        ips = images * world_size / times["batch_time"]
        bar.set_postfix_str(f"loss {values['loss']:.3f}, {ips:.0f} img/s", refresh=False)
        bar.update()
        if (step + 1) % print_interval == 0 or step + 1 == total:
            report.log(
                [epoch, step + 1],
                dict(values, ips=ips, progress=f"{step + 1}/{total}", **times),
                console=not report.interactive,
            )
        tic = time.perf_counter()
    bar.close()
    elapsed = time.perf_counter() - epoch_start
    summary = {f"train.{k}": v for k, v in meter.averages().items() if k != "lr"}
    summary.update({f"train.{k}": v for k, v in timing.averages().items()})
    summary["train.ips"] = meter.count * world_size / elapsed
    summary["train.images"] = meter.count * world_size
    summary["train.seconds"] = elapsed
    return summary


def evaluate(exe, programs, loader, epoch, report, all_reduce=None):
    """Exact top-1 / top-k / loss over every image of ``loader``.

    Counts are summed on the host (the loader cuts the padded last batch), then
    across ranks with ``all_reduce`` when there are several.
    """
    fetch_list = [programs.eval_fetches["topk"], programs.eval_fetches["loss"]]
    totals = np.zeros(4)
    start = time.perf_counter()
    bar = report.progress(len(loader), f"validation {epoch}")
    for feed in loader:
        top_classes, losses = exe.run(
            programs.eval_compiled or programs.eval, feed=feed, fetch_list=fetch_list
        )
        totals += eval_counts(top_classes, losses, np.array(feed[feeds.LABEL]))
        watchdog.beat()
        bar.update()
    bar.close()
    if all_reduce is not None:
        totals = all_reduce(totals)
    result = accuracy_from_counts(totals, programs.eval_fetches["topk"].shape[-1], prefix="val.")
    result["val.seconds"] = time.perf_counter() - start
    report.log([epoch], result, kind="VAL")
    return result
