"""What a ResNet-50 checkpoint costs to write and read in each format the toolkit could
keep: ``paddle.static.save``'s pickles (what it writes: model.pdparams, model.pdopt) read
through ``core/safe_pickle`` (what it reads them with) and, for the cost of that, through
Python's C unpickler (which would run a crafted file's code); against the same tensors
in safetensors (``safetensors.numpy``: no code path at all). The contenders take turns,
round after round, on the same tensors; the table is the median of each.

    .venv/bin/python scripts/benchmark_checkpoint_format.py   # benchmarks/checkpoint_format.json

The train program is train.py's (ResNet-50, 1000 classes, Momentum: the velocities are
the .pdopt), its parameters initialised by the startup program; files in a temporary
folder, read back from the page cache (the CPU's part of a load, not the disk's).
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import pickle
import statistics
import tempfile
import time

import numpy as np
import paddle

from paddle_resnet.core import devices
from paddle_resnet.core.config import build_config
from paddle_resnet.core.optional import require
from paddle_resnet.training import checkpoint, ir, prepare


def resnet50_state():
    """{name: array} of ResNet-50's train program after its startup: parameters, BN
    statistics, velocities, the learning rate."""
    config = build_config(
        {"model.arch": "resnet50", "model.num_classes": 1000, "data.batch_size": 256}
    )
    with ir.selected(config):
        programs, _ = prepare.ready_for_weights(config, True, 1, 1, paddle.CPUPlace())
        folder = tempfile.mkdtemp()
        paddle.static.save(programs.train, os.path.join(folder, "model"))
    return programs.train, checkpoint.read_state(os.path.join(folder, "model"))


def timed(action):
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default="benchmarks/checkpoint_format.json")
    args = parser.parse_args()
    safetensors = require("safetensors.numpy", "this benchmark")
    paddle.enable_static()
    train, state = resnet50_state()
    folder = tempfile.mkdtemp()
    prefix = os.path.join(folder, "model")
    tensors_file = os.path.join(folder, "model.safetensors")
    contiguous = {name: np.ascontiguousarray(value) for name, value in state.items()}

    def unsafe_pickle():
        for suffix in (".pdparams", ".pdopt"):
            with open(prefix + suffix, "rb") as handle:
                pickle.load(handle, encoding="latin1")

    contenders = {
        "save: paddle.static.save (.pdparams + .pdopt)": lambda: paddle.static.save(train, prefix),
        "save: safetensors": lambda: safetensors.save_file(contiguous, tensors_file),
        "load: core/safe_pickle (checkpoint.read_state)": lambda: checkpoint.read_state(prefix),
        "load: Python's C unpickler (runs a file's code)": unsafe_pickle,
        "load: safetensors": lambda: safetensors.load_file(tensors_file),
    }
    seconds = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, action in contenders.items():
            seconds[name].append(timed(action))
    sizes = {
        "pickles_bytes": sum(os.path.getsize(prefix + s) for s in (".pdparams", ".pdopt")),
        "safetensors_bytes": os.path.getsize(tensors_file),
    }
    result = {
        "command": "python scripts/benchmark_checkpoint_format.py",
        "cpu": devices.cpu_model(),
        "paddle": paddle.__version__,
        "tensors": len(state),
        "elements": int(sum(value.size for value in state.values())),
        **sizes,
        "rounds": args.rounds,
        "median_seconds": {name: round(statistics.median(s), 4) for name, s in seconds.items()},
        "seconds": {name: [round(x, 4) for x in s] for name, s in seconds.items()},
    }
    for name, median in result["median_seconds"].items():
        print(f"{median:8.3f} s  {name}")
    print(
        f"files: pickles {sizes['pickles_bytes'] / 1e6:.1f} MB, safetensors {sizes['safetensors_bytes'] / 1e6:.1f} MB"
    )
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
