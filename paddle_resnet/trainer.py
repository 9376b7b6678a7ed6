"""The training loop: plain functions over programs built by ``program.py``."""
import time

import numpy as np

# The feed that carries the MixUp weight; program.py builds it (defined here, where
# the weights are drawn, so this module needs no Paddle import).
MIXUP_FEED = "mixup_lambda"


class Meter:
    """Image-weighted running averages of named values."""

    def __init__(self):
        self.sums, self.count = {}, 0

    def update(self, values, images):
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value) * images
        self.count += images

    def averages(self):
        return {key: total / max(self.count, 1) for key, total in self.sums.items()}


def _num_images(feed):
    label = feed["label"]
    return len(label) if isinstance(label, np.ndarray) else label.shape()[0]


def train_one_epoch(exe, programs, loader, epoch, report, print_interval, world_size=1,
                    mixup_alpha=0.0, seed=0):
    """One pass of ``loader`` through the train program; returns the epoch's averages.

    Steps the LR scheduler after every batch. With ``mixup_alpha`` each step's MixUp
    weight is drawn from Beta(alpha, alpha), seeded by (seed, epoch) so that a
    resumed run draws the same weights.
    """
    rng = np.random.RandomState(seed + epoch)
    names = list(programs.train_fetches)
    fetch_list = list(programs.train_fetches.values())
    meter = Meter()
    timing = Meter()
    total = len(loader)
    epoch_start = tic = time.perf_counter()
    for step, feed in enumerate(loader):
        fed = time.perf_counter()
        if mixup_alpha > 0:
            feed = dict(feed, **{MIXUP_FEED: np.array([rng.beta(mixup_alpha, mixup_alpha)],
                                                      dtype=np.float32)})
        lr = programs.lr_scheduler.get_lr()
        results = exe.run(programs.train, feed=feed, fetch_list=fetch_list)
        programs.lr_scheduler.step()
        done = time.perf_counter()
        images = _num_images(feed)
        values = {name: float(np.mean(value)) for name, value in zip(names, results)}
        meter.update(values, images)
        times = {"data_time": fed - tic, "compute_time": done - fed, "batch_time": done - tic}
        timing.update(times, 1)
        if (step + 1) % print_interval == 0 or step + 1 == total:
            report.log([epoch, step + 1], dict(
                values, lr=lr, ips=images * world_size / times["batch_time"],
                progress=f"{step + 1}/{total}", **times))
        tic = time.perf_counter()
    elapsed = time.perf_counter() - epoch_start
    summary = {f"train.{k}": v for k, v in meter.averages().items()}
    summary.update({f"train.{k}": v for k, v in timing.averages().items()})
    summary["train.ips"] = meter.count * world_size / elapsed
    summary["train.images"] = meter.count * world_size
    summary["train.seconds"] = elapsed
    return summary


def count_eval_batch(top_classes, losses, labels):
    """(images, top-1 hits, top-k hits, loss sum) of one evaluated batch."""
    labels = np.asarray(labels).reshape(-1, 1)
    hits = np.asarray(top_classes) == labels
    return np.array([len(labels), hits[:, :1].any(axis=1).sum(), hits.any(axis=1).sum(),
                     np.asarray(losses, dtype=np.float64).sum()], dtype=np.float64)


def evaluate(exe, programs, loader, epoch, report, all_reduce=None):
    """Exact top-1 / top-k / loss over every image of ``loader``.

    Counts are summed on the host (the loader cuts the padded last batch), then
    across ranks with ``all_reduce`` when there are several.
    """
    fetch_list = [programs.eval_fetches["topk"], programs.eval_fetches["loss"]]
    totals = np.zeros(4)
    start = time.perf_counter()
    for feed in loader:
        top_classes, losses = exe.run(programs.eval, feed=feed, fetch_list=fetch_list)
        totals += count_eval_batch(top_classes, losses, np.array(feed["label"]))
    if all_reduce is not None:
        totals = all_reduce(totals)
    images, top1, topk, loss = totals
    k = programs.eval_fetches["topk"].shape[-1]
    result = {"val.loss": loss / images, "val.top1": top1 / images, f"val.top{k}": topk / images,
              "val.images": int(images), "val.seconds": time.perf_counter() - start}
    report.log([epoch], result, kind="VAL")
    return result
