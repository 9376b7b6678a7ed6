"""Data parallelism on this machine's cores: 2 processes x 1 thread (gloo) against
1 process x 2 threads, the same global batch, in the same run, each with OpenMP's idle
threads spinning (its default) and sleeping (``THREAD_WAITS``), and the all-reduce's
share of a two-rank step.

    .venv/bin/python scripts/benchmark_data_parallel.py --config resnet18_demo \\
        --image-root demo_data/fashion_mnist_demo --global-batch 64

Each variant is ``train.py --benchmark --run-scope train_only`` (warm-up steps, then
timed steps, data loading included); they alternate in ABBA order ``--repeats`` times.
The all-reduce share: two ranks all-reduce (gloo, ring 0, as Fleet's fused all-reduce
does) a float32 buffer the size of the model's trainable parameters, timed, over the
median two-rank step time. Writes the figures to --output (JSON).
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import paddle

from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.config import ModelConfig
from paddle_resnet.core.errors import exit_status
from paddle_resnet.core.report import read_report
from paddle_resnet.models import build_model
from paddle_resnet.training import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trainable_parameters(arch):
    paddle.disable_static()
    count = sum(
        int(np.prod(p.shape))
        for p in build_model(ModelConfig(arch=arch)).parameters()
        if not p.stop_gradient
    )
    paddle.enable_static()
    return count


# How idle OpenMP threads wait: spinning (the default) keeps one process's two threads
# ready between ops; sleeping (what scripts/test.sh sets so that test processes do not
# steal each other's cores) makes them wake up for every op.
THREAD_WAITS = {
    "threads spin (OpenMP default)": {},
    "threads sleep (KMP_BLOCKTIME=0, OMP_WAIT_POLICY=PASSIVE)": {
        "KMP_BLOCKTIME": "0",
        "OMP_WAIT_POLICY": "PASSIVE",
    },
}


def run_variant(ranks, batch, args, scratch, wait_env):
    """train.py --benchmark with ``ranks`` processes of ``batch`` images; its summary."""
    out = tempfile.mkdtemp(dir=scratch)
    train = [
        "train.py",
        "--config",
        args.config,
        "--image-root",
        args.image_root,
        "--model-arch-name",
        args.arch,
        "--batch-size",
        str(batch),
        "--benchmark",
        "--run-scope",
        "train_only",
        "--benchmark-steps",
        str(args.steps),
        "--benchmark-warmup-steps",
        str(args.warmup),
        "--output-dir",
        out,
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("KMP_BLOCKTIME", "OMP_WAIT_POLICY")}
    env.update(wait_env)
    env.pop("OMP_NUM_THREADS", None)  # the toolkit splits the cores over the ranks
    command = (
        [
            sys.executable,
            "-m",
            "paddle.distributed.launch",
            "--nproc_per_node",
            str(ranks),
            "--log_dir",
            os.path.join(out, "logs"),
            *train,
        ]
        if ranks > 1
        else [sys.executable, *train]
    )
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return next(
        r["data"] for r in read_report(os.path.join(out, "report.json")) if r["step"] == "BENCHMARK"
    )


def cpu_model(cpuinfo="/proc/cpuinfo"):
    with open(cpuinfo) as handle:
        names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
    return names[0] if names else "unknown"


def allreduce_worker(size, repeats, output):
    """Inside a 2-rank launch: time the all-reduce of ``size`` float32 values."""
    rank, _ = distributed.init_fleet()
    paddle.enable_static()
    main, buffer = distributed.all_reduce_program("buffer", [size], "float32")
    exe = paddle.static.Executor(paddle.CPUPlace())
    feed = {"buffer": np.ones(size, np.float32)}
    exe.run(main, feed=feed, fetch_list=[buffer])
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[buffer])
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        with open(output, "w") as handle:
            json.dump({"allreduce_ms": 1000 * statistics.median(seconds)}, handle)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="resnet18_demo")
    parser.add_argument("--image-root", default="demo_data/fashion_mnist_demo")
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default="benchmark_data_parallel.json")
    parser.add_argument(
        "--allreduce-worker", nargs=3, metavar=("SIZE", "REPEATS", "OUTPUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.allreduce_worker:
        size, repeats, output = args.allreduce_worker
        return allreduce_worker(int(size), int(repeats), output)

    scratch = tempfile.mkdtemp(prefix="benchmark_dp_")
    variants = {
        "1 process x 2 threads": (1, args.global_batch),
        "2 processes x 1 thread": (2, args.global_batch // 2),
    }
    conditions = {}
    for wait, wait_env in THREAD_WAITS.items():
        runs = {name: [] for name in variants}
        for repeat in range(args.repeats):
            order = list(variants.items())
            for name, (ranks, batch) in order if repeat % 2 == 0 else order[::-1]:
                summary = run_variant(ranks, batch, args, scratch, wait_env)
                runs[name].append(summary)
                print(
                    f"{wait}, repeat {repeat + 1}: {name}: {summary['train.ips']:.1f} img/s, "
                    f"step p50 {summary['train.step_ms_p50']:.0f} ms",
                    flush=True,
                )
        ips = {n: statistics.median(s["train.ips"] for s in values) for n, values in runs.items()}
        conditions[wait] = {
            "env": wait_env,
            "runs": runs,
            "median_ips": ips,
            "ips_range": {
                n: [min(s["train.ips"] for s in v), max(s["train.ips"] for s in v)]
                for n, v in runs.items()
            },
            "ratio_2proc_over_1proc": ips["2 processes x 1 thread"] / ips["1 process x 2 threads"],
        }
    spinning = conditions[next(iter(THREAD_WAITS))]
    two_rank_step = statistics.median(
        s["train.step_ms_p50"] for s in spinning["runs"]["2 processes x 1 thread"]
    )
    size = trainable_parameters(args.arch)
    timing = os.path.join(scratch, "allreduce.json")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "paddle.distributed.launch",
            "--nproc_per_node",
            "2",
            "--log_dir",
            os.path.join(scratch, "allreduce_logs"),
            __file__,
            "--allreduce-worker",
            str(size),
            "10",
            timing,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    with open(timing) as handle:
        allreduce_ms = json.load(handle)["allreduce_ms"]
    result = {
        "arch": args.arch,
        "global_batch": args.global_batch,
        "cores": available_cores(),
        "cpu": cpu_model(),
        "paddle": paddle.__version__,
        "conditions": conditions,
        "allreduce_values": size,
        "allreduce_ms": allreduce_ms,
        "two_rank_step_ms_p50": two_rank_step,
        "allreduce_share_of_step": allreduce_ms / two_rank_step,
    }
    for wait, condition in conditions.items():
        print(f"{wait}: 2 processes / 1 process: {condition['ratio_2proc_over_1proc']:.2f}x")
    print(
        f"all-reduce of {size:,} values {allreduce_ms:.0f} ms = "
        f"{100 * result['allreduce_share_of_step']:.1f} % of a {two_rank_step:.0f} ms "
        "two-rank step (threads spinning)"
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    sys.exit(exit_status(main))
