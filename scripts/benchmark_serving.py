"""Serving benchmark: paddle-resnet-serve under a real load against inference.py's offline
figures, on the same export, backend and cores, in alternating slices.

    bash scripts/setup_serve.sh
    .venv/bin/python scripts/benchmark_serving.py --output benchmarks/serving_resnet50_cpu.json

A ResNet-50 at 224 px with its initial weights (speed does not depend on them) is exported
fp32 and int8 (post-training quantized, abs_max on 64 images) as scripts/benchmark_inference.py
exports it. For each precision, on OpenVINO (the backend --backend auto takes where the
export verified on it), three processes take turns in slices of --slice-seconds, for
--rounds rounds:

- offline: the classifier inference.py --mode benchmark builds and times (synthetic
  images), at batch 1 and batch 32, in this environment;
- served: paddle-resnet-serve (the serving environment) with its defaults for batching,
  under scripts/serving_load.py's load: tritonclient's asyncio gRPC client keeping 1, 8 and
  32 requests of one image (an FP32 tensor) in flight, on loopback; and at 32, the same over
  REST, and JPEGs (ImageNet photos, 512 px, preprocessed by the server) over gRPC.

The load runs on the same cores as the server (2 here): its own work is part of what the
served figures pay. Each figure is the median of its slices; each ratio the median of the
paired per-round ratios (``core/interleave.py``), with their spread. The goals: at
concurrency 32 the served images/s at least 0.8x the offline batch-32 images/s; at
concurrency 1 the served p99 latency at most 1.5x the offline batch-1 latency (its median).
inference.py --mode benchmark itself is run once per precision too, for its table. The
machine's load average is recorded before and after (run it on a quiet machine)."""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

# scripts/ is on the path of a script: its exports are benchmark_inference.py's
from benchmark_inference import export_random_models

from paddle_resnet.core import interleave
from paddle_resnet.core.bootstrap import REPOSITORY, available_cores
from paddle_resnet.core.config import InferenceConfig, ServeConfig
from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.core.metrics import time_steps
from paddle_resnet.core.report import read_report
from paddle_resnet.data.fashion_mnist import write_tree
from paddle_resnet.deploy import backends

SERVING_PYTHON = os.path.join(REPOSITORY, ".venv-serve", "bin", "python")
LOAD = os.path.join(REPOSITORY, "scripts", "serving_load.py")
OFFLINE_BATCHES = (1, 32)
CONCURRENCIES = (1, 8, 32)
# at the highest concurrency also: REST, and encoded photos the server preprocesses
EXTRA_LOADS = (("http", "tensor"), ("grpc", "jpeg"))
MAX_REQUESTS = 20_000  # per slice: a bound besides its seconds
THROUGHPUT_GOAL = 0.8
LATENCY_GOAL = 1.5


class Worker(interleave.SliceWorker):
    """A contender process asked for slices in JSON lines (what to run), answering JSON."""

    def ask(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._answer()


def offline_worker(args):
    """This process as the offline contender: the classifier inference.py --mode benchmark
    builds for the export, timed step by step on its synthetic images."""
    config = InferenceConfig(
        model_dir=args.offline_worker, backend="openvino", cpu_precision=args.precision
    )
    classifier, info, _, notes = backends.build_classifier(config, max(OFFLINE_BATCHES))
    pool = np.random.default_rng(0).standard_normal([max(OFFLINE_BATCHES), *info["input_shape"]])
    pool = pool.astype(np.float32)
    for batch in OFFLINE_BATCHES:
        time_steps(lambda: classifier(pool[:batch]), 3, 0)
    print(json.dumps({"ready": True, "notes": notes}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        batch = pool[: ask["batch"]]
        seconds, start = [], time.perf_counter()
        while time.perf_counter() - start < ask["seconds"] or len(seconds) < 3:
            seconds += time_steps(lambda: classifier(batch), 0, 1)
        ms = np.array(seconds) * 1000.0
        answer = {
            "ips": ask["batch"] * len(seconds) / float(np.sum(seconds)),
            "latency_ms": {
                "mean": float(ms.mean()),
                "p50": float(np.percentile(ms, 50)),
                "p99": float(np.percentile(ms, 99)),
            },
        }
        print(json.dumps(answer), flush=True)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model_dir, precision, name, log, flags):
    """paddle-resnet-serve on ``model_dir`` (OpenVINO, ``precision``) with its default
    batching but for ``flags``, once ready: (process, http port, grpc port)."""
    ports = free_port(), free_port()
    command = [SERVING_PYTHON, "-m", "paddle_resnet.commands.serve", "--inference-dir", model_dir]
    command += ["--backend", "openvino", "--cpu-precision", precision, "--model-name", name]
    command += ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), *flags]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready") as answer:
                if answer.status == 200:
                    return process, *ports
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"paddle-resnet-serve did not get ready on {model_dir}")


def resident_mb(pid):
    with open(f"/proc/{pid}/status") as handle:
        line = next(line for line in handle if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def inference_py_table(model_dir, precision, workdir):
    """inference.py --mode benchmark's own figures for the export (its BENCHMARK records)."""
    log = os.path.join(workdir, f"inference_{precision}.json")
    command = [sys.executable, os.path.join(REPOSITORY, "inference.py"), "--mode", "benchmark"]
    command += ["--inference-dir", model_dir, "--backend", "openvino", "--cpu-precision", precision]
    command += ["--benchmark-batch-sizes", ",".join(map(str, OFFLINE_BATCHES)), "--use-synthetic"]
    command += ["--benchmark-steps", "50", "--benchmark-warmup-steps", "5"]
    subprocess.run(command + ["--inference-log-path", log], check=True, capture_output=True)
    return [record["data"] for record in read_report(log) if record["step"] == "BENCHMARK"]


def contenders(offline, load, seconds):
    """{name: one slice of it -> its figures}, in the order of their turns."""
    runs = {
        f"offline batch {b}": (lambda b=b: offline.ask({"batch": b, "seconds": seconds}))
        for b in OFFLINE_BATCHES
    }
    loads = [("grpc", "tensor", c) for c in CONCURRENCIES]
    loads += [(protocol, kind, CONCURRENCIES[-1]) for protocol, kind in EXTRA_LOADS]
    for protocol, kind, concurrency in loads:
        ask = {"protocol": protocol, "input": kind, "concurrency": concurrency}
        ask.update(seconds=seconds, max_requests=MAX_REQUESTS)
        runs[f"served {protocol} {kind} c{concurrency}"] = lambda ask=ask: load.ask(ask)
    return runs


def median_figures(slices):
    """The median of each figure over the slices of one contender."""
    summary = {"ips": interleave.median_speed([s["ips"] for s in slices])}
    for key in ("mean", "p50", "p99"):
        summary[f"latency_{key}_ms"] = round(
            float(np.median([s["latency_ms"][key] for s in slices])), 2
        )
    for key in ("rps", "batch_size_mean", "requests", "errors"):
        if key in slices[0]:
            summary[key] = round(float(np.median([s[key] for s in slices])), 2)
    return summary


def goals(slices):
    """The two goals, each a paired per-round ratio against its bound."""
    top = f"served grpc tensor c{CONCURRENCIES[-1]}"
    throughput = interleave.paired_ratio(
        [s["ips"] for s in slices[top]], [s["ips"] for s in slices["offline batch 32"]]
    )
    latency = interleave.paired_ratio(
        [s["latency_ms"]["p99"] for s in slices["served grpc tensor c1"]],
        [s["latency_ms"]["p50"] for s in slices["offline batch 1"]],
    )
    return {
        "throughput": dict(
            throughput,
            what=f"{top} images/s over offline batch-32 images/s",
            goal=f">= {THROUGHPUT_GOAL}",
            met=throughput["median"] >= THROUGHPUT_GOAL,
        ),
        "latency": dict(
            latency,
            what="served grpc tensor c1 p99 latency over offline batch-1 median latency",
            goal=f"<= {LATENCY_GOAL}",
            met=latency["median"] <= LATENCY_GOAL,
        ),
    }


class Served:
    """A server of an export (paddle-resnet-serve with ``flags``) and its load generator;
    ``stop()`` ends both: the server's exit status, its resident memory before, its own
    lines (not KServe's)."""

    def __init__(self, model_dir, precision, flags, log_path, jpegs):
        name = f"resnet50_{precision}"
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.server, http_port, grpc_port = start_server(model_dir, precision, name, log, flags)
        try:
            self.load = Worker(
                [SERVING_PYTHON, LOAD, "--grpc", f"127.0.0.1:{grpc_port}", "--http"]
                + [f"127.0.0.1:{http_port}", "--model", name, "--shape", "3,224,224"]
                + ["--jpegs", ",".join(jpegs)]
            )
        except RuntimeError:
            self.server.kill()
            raise

    def stop(self):
        memory = resident_mb(self.server.pid)
        self.load.close()
        self.server.send_signal(signal.SIGTERM)
        status = self.server.wait(timeout=180)
        with open(self.log_path) as log:
            lines = [line for line in log.read().splitlines() if not line.startswith("20")]
        return {"resident_mb": round(memory, 1), "exit_status": status, "lines": lines}


def alternate(runs, rounds):
    """{contender: its slices}: one untimed slice each (caches, connections, compiled
    batches), then ``rounds`` rounds of turns; and the load average at each round."""
    for run in runs.values():
        run()
    slices, loads = {name: [] for name in runs}, []
    for _ in range(rounds):
        loads.append(os.getloadavg()[0])
        for contender, run in runs.items():
            slices[contender].append(run())
    return slices, loads


def measure(model_dir, precision, args, workdir, jpegs):
    """The served export against the offline classifier, and the goals."""
    served = Served(
        model_dir, precision, args.serve_flags, os.path.join(workdir, f"{precision}.log"), jpegs
    )
    try:
        offline = Worker(
            [sys.executable, __file__, "--offline-worker", model_dir, "--precision", precision]
        )
        try:
            runs = contenders(offline, served.load, args.slice_seconds)
            slices, loads = alternate(runs, args.rounds)
        finally:
            offline.close()
    finally:
        server = served.stop()
    return {
        "figures": {contender: median_figures(found) for contender, found in slices.items()},
        "goals": goals(slices),
        "slices": slices,
        "load_average_by_round": loads,
        "server": server,
        "offline_notes": offline.info["notes"],
        "inference_py": inference_py_table(model_dir, precision, workdir),
    }


def compare_variants(model_dir, precision, args, workdir, jpegs):
    """Servers that differ by their flags (``--variants``: batching settings) under the same
    load (gRPC tensors at each concurrency), in alternating slices; each against the first."""
    servers = {}
    try:
        for index, variant in enumerate(args.variants):
            log = os.path.join(workdir, f"{precision}_variant{index}.log")
            servers[variant] = Served(model_dir, precision, variant.split(), log, jpegs)
        runs = {
            (variant, concurrency): (
                lambda load=served.load, c=concurrency: load.ask(
                    {"protocol": "grpc", "input": "tensor", "concurrency": c}
                    | {"seconds": args.slice_seconds, "max_requests": MAX_REQUESTS}
                )
            )
            for concurrency in CONCURRENCIES
            for variant, served in servers.items()
        }
        slices, loads = alternate(runs, args.rounds)
    finally:
        stopped = {variant: served.stop() for variant, served in servers.items()}
    first = args.variants[0]
    return {
        variant: {
            f"c{c}": dict(
                median_figures(slices[(variant, c)]),
                ips_over_first=interleave.paired_ratio(
                    [s["ips"] for s in slices[(variant, c)]], [s["ips"] for s in slices[(first, c)]]
                ),
                p99_over_first=interleave.paired_ratio(
                    [s["latency_ms"]["p99"] for s in slices[(variant, c)]],
                    [s["latency_ms"]["p99"] for s in slices[(first, c)]],
                ),
            )
            for c in CONCURRENCIES
        }
        | {"server": stopped[variant], "load_average_by_round": loads}
        for variant in args.variants
    }


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="int8,fp32", type=lambda t: t.split(","))
    parser.add_argument("--slice-seconds", type=float, default=3.0, help="each contender's turn")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of turns")
    parser.add_argument(
        "--calibration-root",
        default=os.path.join("demo_data", "serving_calibration"),
        help="an image tree whose train/ images calibrate the int8 export (written from "
        "Fashion-MNIST when missing)",
    )
    parser.add_argument(
        "--serve-flags",
        default=[],
        type=str.split,
        help="paddle-resnet-serve flags other than its defaults, e.g. '--max-wait-ms 0'",
    )
    parser.add_argument(
        "--exports",
        help="a folder for the exports (fp32/, int8/), reused when there; default: a temporary one",
    )
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(";"),
        help="instead: servers with these flags (';' between servers, e.g. "
        "'--max-wait-ms 0;--max-wait-ms 2') under the same load, each against the first",
    )
    parser.add_argument("--output", default="benchmarks/serving_resnet50_cpu.json")
    parser.add_argument("--offline-worker", help=argparse.SUPPRESS)  # a contender process
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    return parser.parse_args()


def photos():
    """The 20 ImageNet validation JPEGs (512 px) of the foolbox wheel (scripts/setup.sh
    installs it; located without importing foolbox, whose dependencies are not installed)."""
    folder = os.path.join(importlib.util.find_spec("foolbox").submodule_search_locations[0], "data")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".jpg"))


def main():
    args = parse_args()
    if args.offline_worker:
        return offline_worker(args)
    if not os.path.isfile(SERVING_PYTHON):
        raise UserError("no serving environment: bash scripts/setup_serve.sh")
    before = os.getloadavg()
    write_tree(args.calibration_root, 8, 2, log=lambda _: None)
    export_args = argparse.Namespace(
        arch="resnet50", size=224, ir="legacy", calibration_root=args.calibration_root
    )
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        exports = args.exports or workdir
        folders = {precision: os.path.join(exports, precision) for precision in ("fp32", "int8")}
        if not all(map(os.path.isdir, folders.values())):
            export_random_models(export_args, exports)
        run = compare_variants if args.variants else measure
        for precision in args.precisions:
            results[precision] = run(folders[precision], precision, args, workdir, photos())
    document = {
        "command": shlex.join([os.path.relpath(sys.executable, REPOSITORY), *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "cpu": cpu_model(),
            "cores": available_cores(),
            "load_average_before": before,
            "load_average_after": os.getloadavg(),
        },
        "model": "resnet50 (initial weights), 224 px, legacy IR export; int8: PTQ abs_max",
        "backend": "openvino",
        "serving": {
            "max_batch": ServeConfig().max_batch,
            "max_wait_ms": ServeConfig().max_wait_ms,
            "flags": args.serve_flags,
            "variants": args.variants,
            "load": "tritonclient asyncio, one image per request, loopback, same cores",
        },
        "slice_seconds": args.slice_seconds,
        "rounds": args.rounds,
        "results": results,
    }
    with open(args.output, "w") as handle:
        json.dump(document, handle, indent=1)
    for precision, result in results.items():
        print(f"{precision}:")
        for contender, figures in result.get("figures", result).items():
            print(f"  {contender:28} {json.dumps(figures)[:300]}")
        for goal, found in result.get("goals", {}).items():
            print(f"  goal {goal}: {found['median']} ({found['goal']}) met={found['met']}")
    print(f"wrote {args.output}")


def cpu_model():
    with open("/proc/cpuinfo") as handle:
        return next(line.split(":", 1)[1].strip() for line in handle if "model name" in line)


if __name__ == "__main__":
    sys.exit(exit_status(main))
