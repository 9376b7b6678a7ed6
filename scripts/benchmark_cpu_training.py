"""CPU training speed: the toolkit's default (what a bare ``train.py`` chooses) and its
variants against PyTorch eager, fp32 and bf16 channels-last, in one interleaved run.

    .venv-paddle3/bin/python scripts/benchmark_cpu_training.py   # benchmarks/cpu_training_paddle3.json
    .venv/bin/python scripts/benchmark_cpu_training.py           # benchmarks/cpu_training_paddle2.json

(PyTorch 2.13's CPU build: requirements-test.txt installs it; ``--torch-python`` names
another interpreter that has it.) Same architecture (parameter counts checked
equal), batch, resolution, threads and random data for every contender. Each contender
is a process of its own, built once. The pairs compared (``PAIRS``) take their turns one
pair after the other: the two processes of a pair run slices of ``--slice-seconds`` in
turn (A B A B ...), so that a shared machine's load falls on the slices side by side, and
the pair's ratio is the median of its per-round ratios, with their spread
(``core/interleave.py``); two processes alive at a time keep ResNet-50 at 224 px within
the memory of a small machine. The contenders:
- ``default``: a bare ``train.py`` (its IR, and its CPU kernels as ``cpu_kernels.py``
  measures or finds them in the cache; the line it prints is recorded);
- ``plain`` and ``onednn``: the same IR with ``--no-cpu-onednn`` and ``--cpu-onednn``;
- ``fused``: the default with ``--cpu-fused-bn`` (the toolkit's batch norm + add + ReLU;
  on PIR with Paddle's plain convolutions);
- ``bf16``: ``--amp --amp-dtype bfloat16`` (Paddle 3, a CPU with AVX512-BF16 or AMX);
- ``torch_fp32`` and ``torch_bf16``: PyTorch eager, fp32, and bf16 autocast with
  channels-last tensors (Intel's recipe for its CPUs); ``torch_bf16_compiled``: the latter
  through ``torch.compile`` (``--torch-python`` an interpreter with PyTorch 2.15 for
  PyTorch's newest).
With ``--process`` the contenders are instead the default one under the settings Intel's
CPU training scripts give the process (a preloaded allocator, OpenMP affinity, oneDNN's
primitive cache), each against none. With ``--profile`` the Paddle contenders run once more under Paddle's profiler and the share
of each op type in the step is recorded. Writes a table and --output (JSON).
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import collections
import glob
import json
import os
import sys
import tempfile

import numpy as np
import paddle
import paddle.profiler as profiler

from paddle_resnet.core import bootstrap, devices, feeds, interleave, paddle_internals
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.core.interleave import READY
from paddle_resnet.training import cpu_kernels, cpu_ops, ir, prepare
from paddle_resnet.training import programs as program
from paddle_resnet.training.onednn import onednn_wanted

SETTINGS = "resnet18:32:64,resnet50:224:16"
# contender -> the config values it adds to a bare run's
PADDLE_VARIANTS = {
    "default": {},
    "plain": {"run.cpu_onednn": False},
    "onednn": {"run.cpu_onednn": True},
    "fused": {"run.cpu_fused_bn": True},
    "bf16": {"amp.enabled": True, "amp.dtype": "bfloat16"},
}
TORCH_VARIANTS = ("torch_fp32", "torch_bf16", "torch_bf16_compiled")
# The PyTorch contenders' script: a process without Paddle (with Paddle's libraries loaded
# beside its own, PyTorch's bf16 training ran at a twentieth of its speed: 11 against 213
# img/s, ResNet-18 at 32 px)
TORCH_PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_training_peer.py")
# --process: the settings Intel's CPU training scripts give the process, each on the
# default contender, against none (Debian's allocators: libtcmalloc-minimal4, libjemalloc2)
LIBRARIES = "/usr/lib/x86_64-linux-gnu"
PROCESS_SETTINGS = {
    "none": {},
    "tcmalloc": {"LD_PRELOAD": f"{LIBRARIES}/libtcmalloc_minimal.so.4"},
    "jemalloc": {"LD_PRELOAD": f"{LIBRARIES}/libjemalloc.so.2"},
    "affinity": {
        "KMP_AFFINITY": "granularity=fine,compact,1,0",
        "OMP_PROC_BIND": "close",
        "OMP_PLACES": "cores",
    },
    "primitive cache": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "4096"},
}
# The pairs compared, (numerator, denominator), each in turns of its own: two processes
# alive at a time (six ResNet-50 trainers at 224 px at once took more than the 24 GB of
# the 2-core machine: one was killed by the kernel).
PAIRS = (
    ("default", "torch_fp32"),
    ("plain", "torch_fp32"),
    ("onednn", "torch_fp32"),
    ("fused", "default"),
    ("bf16", "torch_bf16"),
    ("bf16", "torch_bf16_compiled"),
    ("bf16", "default"),
)


def classes_for(size):
    """ImageNet's 1,000 classes at ImageNet sizes; the demo's 10 at its 32 px."""
    return 1000 if size >= 128 else 10


def paddle_variants():
    """The Paddle contenders this machine runs: bf16 on Paddle 3 where the CPU has it."""
    bf16 = paddle_internals.PADDLE3 and paddle_internals.supports_bf16()
    return [name for name in PADDLE_VARIANTS if not name.startswith("bf16") or bf16]


def paddle_config(variant, arch, size, batch):
    """(the Config of a Paddle contender, what it runs): a bare train.py's with the
    contender's flags, its CPU kernels decided as train.py decides them."""
    values = {
        "model.arch": arch,
        "model.num_classes": classes_for(size),
        "data.crop_size": size,
        "data.resize_short": size,
        "data.batch_size": batch,
        **PADDLE_VARIANTS[variant],
    }
    config, fused = cpu_ops.resolved(build_config(values), world_size=1)
    config, kernels = cpu_kernels.resolved(config, world_size=1)
    about = {
        "fused": fused,
        "ir": ir.chosen(config)[0],
        "onednn": bool(onednn_wanted(config)),
        "allocator": bootstrap.allocator(),
    }
    if kernels:
        about["kernels"] = kernels.line()
    return config, about


def paddle_trainer(config):
    """(one training step, trainable parameter count) of ``config``'s train program, on
    its IR (selected by the caller)."""
    batch = config.data.batch_size
    # the programs a training run of this config prepares, one process
    programs, exe = prepare.ready_for_weights(config, True, 1, 1000, paddle.CPUPlace())
    rng = np.random.default_rng(0)
    feed = {
        feeds.IMAGE: rng.standard_normal([batch, *program.input_shape(config)]).astype("float32"),
        feeds.LABEL: rng.integers(0, config.model.num_classes, (batch, 1)).astype("int64"),
    }
    loss = programs.train_fetches["loss"]
    count = sum(int(np.prod(p.shape)) for p in ir.parameters(programs.train) if p.trainable)
    return (lambda: exe.run(programs.train, feed=feed, fetch_list=[loss])), count


def op_shares(step, steps):
    """Share of each op type in the profiled steps' operator time, largest first."""
    with tempfile.TemporaryDirectory() as trace_dir:
        prof = profiler.Profiler(
            targets=[profiler.ProfilerTarget.CPU],
            on_trace_ready=profiler.export_chrome_tracing(trace_dir),
        )
        prof.start()
        for _ in range(steps):
            step()
            prof.step()
        prof.stop()
        events = json.load(open(glob.glob(os.path.join(trace_dir, "*.json"))[0]))["traceEvents"]
    totals = collections.Counter()
    for event in events:
        if event.get("cat") == "Operator":
            totals[event["name"].split("[")[0]] += event["dur"]
    whole = sum(totals.values())
    return {name: round(us / whole, 4) for name, us in totals.most_common(10)}


def worker(args):
    """One contender in this process: built, then slices on request (``serve_slices``),
    or with --profile its op shares as one JSON line."""
    arch, size, batch = args.setting
    config, about = paddle_config(args.worker, arch, size, batch)
    with ir.selected(config):
        step, params = paddle_trainer(config)
        return serve(step, params, about, batch, args.profile)


def serve(step, params, about, batch, profile):
    step()  # warm-up
    if profile:
        step()
        print(json.dumps({"op_shares": op_shares(step, 2)}))
        return
    interleave.serve_slices(step, batch, {"parameters": params, **about})


def start_worker(name, setting, args, profile=False):
    """The contender ``name``: a variant, or with --process a process setting of the
    default contender."""
    if name in PROCESS_SETTINGS:
        environ = dict(os.environ, **PROCESS_SETTINGS[name])
        return interleave.SliceWorker(worker_command("default", setting, args), env=environ)
    # Paddle's contenders run as train.py runs (its allocator), PyTorch's as it is
    environ = os.environ if name in TORCH_VARIANTS else bootstrap.training_environment()
    command = worker_command(name, setting, args) + ["--profile"] * profile
    return interleave.SliceWorker(command, env=dict(environ))


def worker_command(name, setting, args):
    script = (
        [args.torch_python, TORCH_PEER] if name in TORCH_VARIANTS else [sys.executable, __file__]
    )
    return [*script, "--worker", name, "--setting", ":".join(map(str, setting))]


def parse_setting(text):
    arch, size, batch = text.split(":")
    return arch, int(size), int(batch)


def measure_pair(pair, setting, args):
    """Two contenders started, then ``args.rounds`` rounds of their slices, A B A B; their
    entry of the JSON: each one's speed and the paired ratio."""
    workers = {}
    try:
        for name in pair:  # one at a time: each one's build runs alone
            workers[name] = start_worker(name, setting, args)
        counts = {w.info["parameters"] for w in workers.values()}
        if len(counts) != 1:
            raise SystemExit(f"parameter counts differ: {counts}")
        speeds = interleave.alternate(workers, args.rounds, args.slice_seconds)
    finally:
        for worker_process in workers.values():
            worker_process.close()
    entry = {
        name: {
            "ips": interleave.median_speed(speeds[name]),
            "ips_slices": [round(s, 2) for s in speeds[name]],
            "about": {k: v for k, v in workers[name].info.items() if k != READY},
        }
        for name in pair
    }
    return dict(entry, ratio=interleave.paired_ratio(*(speeds[name] for name in pair)))


def _chosen(pair, pairs):
    """Whether --pairs (``a:b,...``, unset: every pair) names ``pair``."""
    return pairs is None or ":".join(pair) in pairs.split(",")


def measure_setting(setting, args):
    """One setting: each pair in its turns; the row of the JSON (``ratios``: each pair's
    median paired ratio and spread; ``pairs``: the contenders' speeds beside it)."""
    names = set(paddle_variants()) | set(TORCH_VARIANTS) | set(PROCESS_SETTINGS)
    pairs = (
        [(name, "none") for name in list(PROCESS_SETTINGS)[1:]]
        if args.process
        else [pair for pair in PAIRS if set(pair) <= names and _chosen(pair, args.pairs)]
    )
    missing = [env["LD_PRELOAD"] for env in PROCESS_SETTINGS.values() if "LD_PRELOAD" in env]
    missing = [path for path in missing if args.process and not os.path.exists(path)]
    if missing:
        raise UserError(
            f"--process preloads {missing[0]}, which is missing: "
            "apt-get install libtcmalloc-minimal4 libjemalloc2"
        )
    arch, size, batch = setting
    row = {"arch": arch, "size": size, "batch": batch, "pairs": {}}
    for pair in pairs:
        row["pairs"]["/".join(pair)] = measure_pair(pair, setting, args)
        print(f"  {'/'.join(pair)}: {pair_line(row['pairs']['/'.join(pair)], pair)}", flush=True)
    row["ratios"] = {name: entry["ratio"] for name, entry in row["pairs"].items()}
    if args.profile and not args.process:
        row["op_shares"] = {}
        for name in paddle_variants():
            profiled = start_worker(name, setting, args, profile=True)
            row["op_shares"][name] = profiled.info["op_shares"]
            profiled.close()
    return row


def pair_line(entry, pair):
    ratio = entry["ratio"]
    speeds = ", ".join(f"{name} {entry[name]['ips']} img/s" for name in pair)
    return f"{ratio['median']}x ({ratio['min']}-{ratio['max']}; {speeds})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=SETTINGS, help="arch:size:batch,...")
    parser.add_argument("--rounds", type=int, default=8, help="slices of each contender")
    parser.add_argument("--slice-seconds", type=float, default=5.0)
    parser.add_argument("--profile", action="store_true", help="record Paddle's op shares")
    parser.add_argument(
        "--pairs", help="only these pairs of PAIRS, e.g. bf16:torch_bf16,fused:default"
    )
    parser.add_argument(
        "--process",
        action="store_true",
        help="instead: the default contender under each of PROCESS_SETTINGS (allocators, "
        "OpenMP affinity, oneDNN's primitive cache) against none",
    )
    parser.add_argument(
        "--torch-python",
        default=sys.executable,
        help="the interpreter of the PyTorch contenders (PyTorch 2.13's CPU build)",
    )
    parser.add_argument(
        "--output", default=f"benchmarks/cpu_training_paddle{paddle.__version__.split('.')[0]}.json"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--setting", type=parse_setting, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set((args.pairs or "").split(",")) - {"", *(":".join(pair) for pair in PAIRS)}
    if unknown:
        raise UserError(f"--pairs: not a pair of PAIRS: {', '.join(sorted(unknown))}")
    if args.worker:
        return worker(args)
    results = []
    for setting in map(parse_setting, args.settings.split(",")):
        print(f"{':'.join(map(str, setting))} (arch:size:batch)", flush=True)
        results.append(measure_setting(setting, args))
    record = {
        "cpu": devices.cpu_model(),
        "threads": bootstrap.available_cores(),
        "paddle": paddle.__version__,
        "rounds": args.rounds,
        "slice_seconds": args.slice_seconds,
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as out:
        json.dump(record, out, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
