"""Counting and timing: image-weighted averages, exact top-k counts, latency percentiles."""

import time

import numpy as np

TOP_K = 5  # top-5 accuracy, or top-k for data sets of fewer classes
PERCENTILES = (50, 90, 95, 99)


def top_k(num_classes):
    return min(TOP_K, num_classes)


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


def eval_counts(top_classes, losses, labels):
    """(images, top-1 hits, top-k hits, loss sum) of a batch: summed, exact accuracies."""
    labels = np.asarray(labels).reshape(-1, 1)
    hits = np.asarray(top_classes) == labels
    loss = np.asarray(losses, dtype=np.float64).sum()
    counts = [len(labels), hits[:, :1].any(axis=1).sum(), hits.any(axis=1).sum(), loss]
    return np.array(counts, dtype=np.float64)


def accuracy_from_counts(totals, k, prefix=""):
    """{loss, top1, top<k>, images} from summed ``eval_counts``."""
    images, top1, topk, loss = totals
    return {
        f"{prefix}loss": loss / images,
        f"{prefix}top1": top1 / images,
        f"{prefix}top{k}": topk / images,
        f"{prefix}images": int(images),
    }


def time_steps(step, warmup_steps, steps):
    """Call ``step()`` ``warmup_steps`` times untimed, then ``steps`` times; the seconds of each."""
    for _ in range(warmup_steps):
        step()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return seconds


def latency_summary(images_per_step, seconds):
    """Throughput (img/s) and latency average and percentiles (ms) of per-step timings."""
    ms = np.asarray(seconds) * 1000.0
    summary = {"batch_size": images_per_step, "ips": images_per_step / float(np.mean(seconds))}
    summary["latency_avg"] = float(ms.mean())
    return summary | {f"latency_p{p}": float(np.percentile(ms, p)) for p in PERCENTILES}


def format_latency_table(rows):
    header = f"{'batch':>5} {'img/s':>9} {'avg ms':>8}" + "".join(
        f" {'p' + str(p):>8}" for p in PERCENTILES
    )
    lines = [
        f"{row['batch_size']:>5} {row['ips']:>9.1f} {row['latency_avg']:>8.2f}"
        + "".join(f" {row[f'latency_p{p}']:>8.2f}" for p in PERCENTILES)
        for row in rows
    ]
    return "\n".join([header, *lines])


# Classes up to this many get the whole confusion matrix in the report; more (ImageNet's
# 1,000) get the most confused pairs instead (each class's accuracy is always there).
FULL_CONFUSION_CLASSES = 100
WORST_CLASSES = 20
CONFUSED_PAIRS = 50


def add_confusions(confusion, top_classes, labels):
    """Add one evaluated batch to the square ``confusion`` counts in place (no matrix per
    batch: 8 MB at 1,000 classes): row the true class, column the top-1 prediction."""
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    predicted = np.asarray(top_classes)[:, 0].astype(np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    return confusion


def confusion_counts(top_classes, labels, num_classes):
    return add_confusions(np.zeros((num_classes, num_classes)), top_classes, labels)


def class_results(confusion, classes):
    """Per-class results from a confusion matrix (``confusion_counts`` summed); the balanced
    top-1 is the mean accuracy of the classes that have images."""
    confusion = np.asarray(confusion, dtype=np.int64)
    images = confusion.sum(axis=1)
    present = images > 0
    accuracy = np.where(present, np.diag(confusion) / np.maximum(images, 1), np.nan)
    order = np.argsort(np.where(present, accuracy, np.inf), kind="stable")
    errors = confusion.copy()
    np.fill_diagonal(errors, 0)
    pairs = np.argsort(-errors, axis=None, kind="stable")[:CONFUSED_PAIRS]
    result = {
        "balanced_top1": float(np.mean(accuracy[present])) if present.any() else 0.0,
        "classes": list(classes),
        "accuracy": [None if np.isnan(a) else float(a) for a in accuracy],
        "images": images.tolist(),
        "worst": [
            [classes[i], float(accuracy[i]), int(images[i])]
            for i in order[:WORST_CLASSES]
            if present[i]
        ],
        "confused": [
            [classes[t], classes[p], int(errors[t, p])]
            for t, p in zip(*np.unravel_index(pairs, errors.shape))
            if errors[t, p] > 0
        ],
    }
    if len(classes) <= FULL_CONFUSION_CLASSES:
        result["confusion"] = confusion.tolist()
    return result


def describe_class_results(result, shown=3):
    """Two lines: the balanced top-1 with the worst classes, the most confused pairs."""
    worst = ", ".join(
        f"{name} {100 * acc:.1f} % of {n}" for name, acc, n in result["worst"][:shown]
    )
    lines = [f"per class: balanced top-1 {100 * result['balanced_top1']:.2f} %; worst: {worst}"]
    if result["confused"]:
        pairs = ", ".join(f"{t} as {p} {n}x" for t, p, n in result["confused"][:shown])
        lines.append(f"most confused: {pairs}")
    return lines


def class_changes(reference, result, shown=5):
    """The classes that lost most from ``reference`` to ``result`` (same images), worst first."""
    if reference["classes"] != result["classes"]:
        raise ValueError("per-class results of different classes cannot be compared")
    changes = []
    for name, before, after, images in zip(
        result["classes"], reference["accuracy"], result["accuracy"], result["images"]
    ):
        if images:
            lost = round((before - after) * images)
            if lost > 0:
                changes.append([name, before, after, lost, images])
    return sorted(changes, key=lambda change: -change[3])[:shown]


def describe_class_changes(changes):
    """One line: the classes that lost most, in points and images."""
    if not changes:
        return "no class lost an image"
    return "lost most: " + ", ".join(
        f"{name} {100 * before:.1f} -> {100 * after:.1f} % ({lost} of {images})"
        for name, before, after, lost, images in changes
    )
