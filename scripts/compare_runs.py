"""Train the same recipe several ways and compare their validation accuracy, overall,
balanced over classes and per class: with and without --class-weights, from scratch and
from a pretrained model, frozen stages or not.

    .venv/bin/python scripts/compare_runs.py --output benchmarks/class_weights_fmnist_20to1.json \
        --variant "plain=" --variant "balanced=--class-weights balanced" \
        -- --config resnet18_demo --image-root demo_data/fashion_mnist_20to1

Each variant is NAME=FLAGS (FLAGS added to the common train.py arguments after --) and
trains in a process of its own (python train.py), into a scratch folder; the same seed
for all. Prints one line per variant and writes --output (JSON): the command lines, the
last validation's top-1 and balanced top-1, each class's accuracy, the classes that
lost most against the first variant, and the package versions.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import paddle

from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.core.metrics import class_changes, describe_class_changes
from paddle_resnet.core.report import validations

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def variant(text):
    name, _, flags = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r}: a variant is NAME=FLAGS")
    return name, shlex.split(flags)


def train(command, output_dir):
    """Run ``command`` (train.py's arguments) into ``output_dir``; its last validation's
    VAL and CLASSES records."""
    argv = [sys.executable, "train.py", *command, "--output-dir", output_dir]
    result = subprocess.run(argv, cwd=REPOSITORY, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"{shlex.join(command)} failed: {result.stderr.strip().splitlines()[-1]}")
    _, val, per_class = validations(os.path.join(output_dir, "report.json"))[-1]
    return val, per_class


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", type=variant, action="append", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("common", nargs=argparse.REMAINDER, help="-- then train.py's arguments")
    args = parser.parse_args()
    common = args.common[1:] if args.common[:1] == ["--"] else args.common
    rows, reference = [], None
    with tempfile.TemporaryDirectory(prefix="compare_runs_") as scratch:
        for name, flags in args.variant:
            command = common + flags
            val, per_class = train(command, os.path.join(scratch, name))
            reference = reference or per_class
            row = {
                "variant": name,
                "command": shlex.join(["python", "train.py", *command]),
                "top1": val["val.top1"],
                "balanced_top1": per_class["balanced_top1"],
                "accuracy": dict(zip(per_class["classes"], per_class["accuracy"])),
                "lost_most_against_first": class_changes(reference, per_class),
            }
            rows.append(row)
            print(
                f"{name}: top-1 {100 * row['top1']:.2f} %, balanced {100 * row['balanced_top1']:.2f}"
                f" %; against {args.variant[0][0]}: "
                f"{describe_class_changes(row['lost_most_against_first'])}",
                flush=True,
            )
    with open(args.output, "w") as handle:
        json.dump({"paddle": paddle.__version__, "rows": rows}, handle, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
