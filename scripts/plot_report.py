"""Plot a training report: loss, top-1 and learning rate per step, validation per epoch.

.venv/bin/pip install -r requirements-tools.txt
.venv/bin/python scripts/plot_report.py output/demo/report.json --output demo.png
"""

import argparse
import sys

from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.core.optional import require
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
    steps = [r for r in records if r["type"] == "LOG"]
    steps_per_epoch = max(int(r["data"]["progress"].split("/")[1]) for r in steps)
    x = [(r["step"][0] - 1) + r["step"][1] / steps_per_epoch for r in steps]
    val = [r for r in records if r["type"] == "VAL"]
    figure, (loss_axes, top1_axes, lr_axes) = plt.subplots(1, 3, figsize=(15, 4))
    loss_axes.plot(x, [r["data"]["loss"] for r in steps], label="train (batch)")
    loss_axes.plot(
        [r["step"][0] for r in val], [r["data"]["val.loss"] for r in val], "o-", label="validation"
    )
    top1_axes.plot(x, [r["data"]["top1"] for r in steps], label="train (batch)")
    top1_axes.plot(
        [r["step"][0] for r in val], [r["data"]["val.top1"] for r in val], "o-", label="validation"
    )
    lr_axes.plot(x, [r["data"]["lr"] for r in steps])
    for axes, title in ((loss_axes, "loss"), (top1_axes, "top-1"), (lr_axes, "learning rate")):
        axes.set_title(title)
        axes.set_xlabel("epoch")
        axes.grid(alpha=0.3)
    loss_axes.legend()
    top1_axes.legend()
    figure.tight_layout()
    figure.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
