"""Training throughput with and without ASP (2:4 sparsity) in the same run, as a ratio.

    .venv/bin/python scripts/benchmark_asp.py --config resnet18_demo --benchmark-steps 40

Every argument goes to train.py; this adds --benchmark --run-scope train_only and,
for the sparse runs, --asp --prune-model. Dense and sparse runs alternate in
ABBA order (--repeats times each) so that drift in the machine's speed hits both alike.
Writes the figures to benchmark_asp.json (--output).
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import sys
import tempfile

from paddle_resnet.commands import train
from paddle_resnet.core.cli import parse
from paddle_resnet.core.errors import exit_status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default="benchmark_asp.json")
    args, train_args = parser.parse_known_args()

    scratch = tempfile.mkdtemp(prefix="benchmark_asp_")  # keep benchmark logs out of real runs

    def config(*extra):
        argv = (
            ["--output-dir", scratch]
            + train_args
            + ["--benchmark", "--run-scope", "train_only", *extra]
        )
        return parse("train", argv)

    variants = {"dense": config(), "asp": config("--asp", "--prune-model")}
    runs = {name: [] for name in variants}
    with open(os.devnull, "w") as quiet:
        for repeat in range(args.repeats):
            order = list(variants.items())
            for name, variant in order if repeat % 2 == 0 else order[::-1]:
                ips = train.run(variant, report_stream=quiet)["train.ips"]
                runs[name].append(ips)
                print(f"repeat {repeat + 1}: {name:5s} {ips:8.2f} img/s", flush=True)
    mean = {name: sum(values) / len(values) for name, values in runs.items()}
    overhead = 1.0 - mean["asp"] / mean["dense"]
    print(
        f"dense {mean['dense']:.2f} img/s, asp {mean['asp']:.2f} img/s: "
        f"asp/dense {mean['asp'] / mean['dense']:.3f}, overhead {100 * overhead:.1f} %"
    )
    with open(args.output, "w") as handle:
        json.dump(
            {
                "runs": runs,
                "mean_ips": mean,
                "asp_over_dense": mean["asp"] / mean["dense"],
                "overhead": overhead,
                "train_args": train_args,
            },
            handle,
            indent=1,
        )


if __name__ == "__main__":
    sys.exit(exit_status(main))
