"""Training speed epoch by epoch, for the code of two checkouts in turn: whether an epoch
after a validation trains as fast as the first (Paddle Inference, which validates on the
CPU, leaves MKL and OpenMP on one thread after each run; ``training/eval_predictor.py``).

    .venv/bin/python -c "from paddle_resnet.data.fashion_mnist import write_tree; \\
        write_tree('/tmp/exp/fm', 300, 50)"
    git worktree add /tmp/before b321a67
    .venv/bin/python scripts/benchmark_epoch_speed.py --image-root /tmp/exp/fm \\
        --before /tmp/before --output benchmarks/epoch_speed.json

Each round runs ``train.py --config resnet18_demo --epochs 2`` once with each checkout's
code (``--before``, then this repository), for each kernel path (``--kernels``: Paddle's
plain kernels, oneDNN's), fresh output folders, no data check; ``--rounds`` rounds, the
two codes alternating (before first in odd rounds, after first in even ones) so that a
shared machine's load and the order fall on both alike. Recorded: each
epoch's ``train.ips`` from the report, per run, and the medians; the table compares each
epoch's median after against before.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import paddle

from paddle_resnet.core import devices
from paddle_resnet.core.report import read_report
from paddle_resnet.training import cpu_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def epoch_speeds(code, kernels, image_root, epochs):
    """train.ips of each epoch of one run of ``code``'s train.py."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "train.py", "--config", "resnet18_demo"]
        command += ["--image-root", image_root, "--epochs", str(epochs)]
        command += ["--output-dir", out, "--no-data-check"]
        env = dict(os.environ, **{cpu_kernels.PIN_VARIABLE: kernels})
        subprocess.run(command, cwd=code, env=env, check=True, capture_output=True)
        records = read_report(os.path.join(out, "report.json"))
        return [r["data"]["train.ips"] for r in records if r["type"] == "EPOCH"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-root", required=True)
    parser.add_argument("--before", required=True, help="a worktree of the code to compare")
    parser.add_argument("--kernels", nargs="+", default=["plain", "onednn"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default="benchmarks/epoch_speed.json")
    args = parser.parse_args()
    codes = {"before": os.path.abspath(args.before), "after": ROOT}
    runs = {k: {label: [] for label in codes} for k in args.kernels}
    for round_number in range(args.rounds):
        for kernels in args.kernels:
            # ABBA: each code goes first in every other round
            order = list(codes.items())[:: -1 if round_number % 2 else 1]
            for label, code in order:
                speeds = epoch_speeds(code, kernels, args.image_root, args.epochs)
                runs[kernels][label].append(speeds)
                print(f"round {round_number + 1} {kernels} {label}: {speeds}", flush=True)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": devices.cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "paddle": paddle.__version__,
        "runs": runs,
        "median_ips": {
            k: {label: [statistics.median(e) for e in zip(*r)] for label, r in by.items()}
            for k, by in runs.items()
        },
    }
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=1)
    print("| kernels | epoch | before img/s | after img/s | after / before |")
    print("|---|---|---|---|---|")
    for kernels, by in result["median_ips"].items():
        for epoch, (old, new) in enumerate(zip(by["before"], by["after"]), 1):
            print(f"| {kernels} | {epoch} | {old:.1f} | {new:.1f} | {new / old:.2f}x |")


if __name__ == "__main__":
    main()
