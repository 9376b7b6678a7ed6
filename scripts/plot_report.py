"""Plot a training report: loss, top-1 and learning rate over the epochs (each logged point
the mean of every step since the one before), validation per epoch, and the last
validation's per-class results: the confusion matrix (up to 100 classes) or the most
confused pairs (more), beside each class's accuracy or the worst classes.

.venv/bin/pip install -r requirements-tools.txt
.venv/bin/python scripts/plot_report.py output/demo/report.json --output demo.png
"""

import argparse
import sys

from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.core.optional import require
from paddle_resnet.core.plots import ANNOTATED_CLASSES, confusions
from paddle_resnet.core.report import read_report


def last_run(records):
    """The records of the last run that trained (runs append to one report, each starting
    with its RUN record; an evaluation or a refused start writes no steps), preferring one
    that also validated; None when no run trained."""
    runs, current = [], []
    for record in records:
        if record["type"] == "RUN" and current:
            runs.append(current)
            current = []
        current.append(record)
    runs.append(current)
    trained = [run for run in runs if any(r["type"] == "LOG" for r in run)]
    validated = [run for run in trained if any(r["type"] == "VAL" for r in run)]
    return (validated or trained or [None])[-1]


def curves(axes, records):
    """Loss, top-1 and learning rate by epoch on three ``axes``; training points are the
    means over every step (``<name>_mean``; reports written before them: the logged batch)."""
    steps = [r for r in records if r["type"] == "LOG"]
    steps_per_epoch = max(int(r["data"]["progress"].split("/")[1]) for r in steps)
    x = [(r["step"][0] - 1) + r["step"][1] / steps_per_epoch for r in steps]
    val = [r for r in records if r["type"] == "VAL"]
    loss_axes, top1_axes, lr_axes = axes
    for panel, name in ((loss_axes, "loss"), (top1_axes, "top1")):
        averaged = all(f"{name}_mean" in r["data"] for r in steps)
        label = "train (mean of the steps)" if averaged else "train (batch)"
        panel.plot(x, [r["data"][f"{name}_mean" if averaged else name] for r in steps], label=label)
        panel.plot(
            [r["step"][0] for r in val],
            [r["data"][f"val.{name}"] for r in val],
            "o-",
            label="validation",
        )
        panel.legend()
    lr_axes.plot(x, [r["data"]["lr"] for r in steps])
    for panel, title in ((loss_axes, "loss"), (top1_axes, "top-1"), (lr_axes, "learning rate")):
        panel.set_title(title)
        panel.set_xlabel("epoch")
        panel.grid(alpha=0.3)


def class_accuracy(axes, result):
    """Each class's accuracy (up to 100 classes: where the report holds the whole
    confusion matrix), or the worst classes, as bars."""
    if "confusion" in result:
        rows = [
            (name, accuracy)
            for name, accuracy in zip(result["classes"], result["accuracy"])
            if accuracy is not None
        ]
        title = "accuracy per class"
    else:
        rows = [(name, accuracy) for name, accuracy, _ in result["worst"]]
        title = f"the {len(rows)} worst classes"
    rows = rows[::-1]
    axes.barh(range(len(rows)), [100 * a for _, a in rows])
    if len(rows) <= ANNOTATED_CLASSES * 2:
        axes.set_yticks(range(len(rows)), [name for name, _ in rows])
    axes.axvline(100 * result["balanced_top1"], color="black", linestyle="--", label="balanced")
    axes.set_xlim(0, 100)
    axes.set_xlabel("top-1 %")
    axes.set_title(title)
    axes.legend(loc="lower right")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--output", default="report.png")
    args = parser.parse_args()

    require("matplotlib", "plotting a report").use("Agg")  # files only: no display needed
    plt = require("matplotlib.pyplot", "plotting a report")

    records = last_run(read_report(args.report))
    if records is None:
        raise UserError(f"{args.report}: no run in it logged training steps")
    per_class = [r for r in records if r["type"] == "CLASSES"]
    rows = 2 if per_class else 1
    figure = plt.figure(figsize=(15, 4 + 6 * (rows - 1)))
    grid = figure.add_gridspec(rows, 3, height_ratios=[4, 6][:rows])
    curves([figure.add_subplot(grid[0, column]) for column in range(3)], records)
    if per_class:
        result, epoch = per_class[-1]["data"], per_class[-1]["step"][0]
        confusions(figure.add_subplot(grid[1, :2]), result, epoch)
        class_accuracy(figure.add_subplot(grid[1, 2]), result)
    figure.tight_layout()
    figure.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
