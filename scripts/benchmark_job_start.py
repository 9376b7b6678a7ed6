"""The start of a training job on an ImageNet-sized tree: the image files it opens and its
wall time, per start, with 1, 2 and 4 CPU ranks, for the code of a checkout (``--code``:
this repository, or an older commit's worktree, to compare).

    .venv/bin/python scripts/benchmark_job_start.py --tree /tmp/check_tree \\
        --label after --output benchmarks/job_start.json
    git worktree add /tmp/before fca7654
    .venv/bin/python scripts/benchmark_job_start.py --tree /tmp/check_tree \\
        --code /tmp/before --label before --output benchmarks/job_start.json

The tree is scripts/benchmark_data_check.py's (1,000 classes, 1,281,167 training files of
about 8 KB), written under ``--tree`` if it is not there yet (kept: pass the same folder
to the next run). Each configuration runs ``--starts`` times into one output folder, as a
job restarted by its scheduler does: ``train.py --benchmark --benchmark-steps 1`` (the
start, then one step of ResNet-18 at 32 px), one process or ``--ranks`` ranks of
``paddle.distributed.launch``. The image files each start opens are counted in every
process by an audit hook (scripts/benchmark_support/sitecustomize.py, put on the ranks'
PYTHONPATH): the header screening opens them from Python; DALI's reads of the one batch
are not counted. A first start of code that caches the screening records the header
pass's own seconds (``pass_seconds``); ``--fingerprint-only`` times what a start of the
unchanged tree spends on it instead (listing the tree and the stat of every file).
Figures are appended to ``--output`` under ``--label``.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

from benchmark_data_check import write_tree

from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.errors import exit_status
from paddle_resnet.data.folder import walk_split
from paddle_resnet.data.screening import fingerprint

SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmark_support")
FLAGS = (
    "--model-arch-name resnet18 --crop-size 32 --resize-short 32 "
    "--batch-size 16 --epochs 1 --warmup-epochs 0 --dali-num-threads 1 "
    "--benchmark --benchmark-steps 1 --benchmark-warmup-steps 0"
).split()


def start(code, tree, out, ranks, counts):
    """One start of the job: (wall seconds, image files opened by all its processes)."""
    classes = len(os.listdir(os.path.join(tree, "train")))
    command = [sys.executable, "-u", "train.py", *FLAGS, "--num-of-class", str(classes)]
    command += ["--image-root", tree]
    command += ["--output-dir", out]
    if ranks > 1:
        launcher = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node"]
        command = [*launcher, str(ranks), "--log_dir", os.path.join(out, "logs"), *command[2:]]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([SUPPORT, code]),
        OPEN_COUNT_DIR=counts,
        OPEN_COUNT_PREFIX=os.path.abspath(tree),
    )
    began = time.perf_counter()
    result = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)}: exit {result.returncode}: {result.stderr[-2000:]}"
        )
    opened = sum(int(open(path).read() or 0) for path in glob.glob(os.path.join(counts, "*")))
    for path in glob.glob(os.path.join(counts, "*")):
        os.remove(path)
    return seconds, opened


def screened_seconds(out, number):
    """{"pass_seconds": the header pass's own seconds} from the cache a first start of the
    toolkit's code writes (``data_check.json``); {} on later starts and for older code."""
    if number > 1:
        return {}
    try:
        with open(os.path.join(out, "data_check.json")) as handle:
            return {"pass_seconds": round(json.load(handle)["seconds"], 1)}
    except (OSError, ValueError, KeyError):
        return {}


def fingerprint_seconds(tree, rounds=3):
    """The seconds (median of ``rounds``) of what a start of an unchanged tree spends on
    it: listing the training split and the fingerprint that matches the cache (a stat per
    file, no file opened), timed in this process."""
    config = SimpleNamespace(
        data=SimpleNamespace(crop_size=32), check=SimpleNamespace(at_start=True)
    )
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        split = SimpleNamespace(image_list=walk_split(tree, "train").image_list())
        fingerprint(config, [split])
        times.append(time.perf_counter() - began)
    return sorted(times)[rounds // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True, help="the ImageNet-sized tree (written if absent)")
    parser.add_argument("--code", default=os.getcwd(), help="the checkout whose train.py runs")
    parser.add_argument("--label", required=True, help="the name of this code's figures")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--output", default="benchmarks/job_start.json")
    parser.add_argument(
        "--fingerprint-only",
        action="store_true",
        help="time only what a start of the unchanged tree spends on it (this checkout's code)",
    )
    args = parser.parse_args()

    def measure():
        if not os.path.isdir(os.path.join(args.tree, "train")):
            write_tree(args.tree, leaks=0)
        load_before, rows = os.getloadavg()[0], []
        if args.fingerprint_only:
            rows.append({"fingerprint_seconds": round(fingerprint_seconds(args.tree), 1)})
            print(json.dumps(rows[-1]), flush=True)
        measured = [] if args.fingerprint_only else [int(n) for n in args.ranks.split(",")]
        for ranks in measured:
            out = tempfile.mkdtemp(prefix=f"job_start_{ranks}_")
            counts = tempfile.mkdtemp(prefix="opens_")
            try:
                for number in range(1, args.starts + 1):
                    seconds, opened = start(args.code, args.tree, out, ranks, counts)
                    row = {"ranks": ranks, "start": number, "seconds": round(seconds, 1)}
                    row["image_files_opened"] = opened
                    row.update(screened_seconds(out, number))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            finally:
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(counts, ignore_errors=True)
        results = {}
        if os.path.exists(args.output):
            with open(args.output) as handle:
                results = json.load(handle)
        commit = subprocess.run(
            ["git", "-C", args.code, "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        results[args.label] = {
            "code": args.code,
            "commit": commit,
            "rows": rows,
            "machine": f"{platform.processor() or platform.machine()}, {available_cores()} cores",
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            "date": time.strftime("%Y-%m-%d"),
        }
        with open(args.output, "w") as handle:
            json.dump(results, handle, indent=1)

    return exit_status(measure)


if __name__ == "__main__":
    sys.exit(main())
