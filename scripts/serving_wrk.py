"""Servers already running under wrk's load (a C load generator: a few percent of a core),
in alternating slices, one JSON file of every slice and the medians. Each contender is
NAME=URL=BODY: a v2 infer URL and a file of the request body (JSON) to POST. With
--offline DIR, each round also times the classifier paddle-resnet-serve builds of that
export (backend auto, all cores) at batch 1 and batch 32, in this process: run it in the
serving environment, where the server's Paddle is.

    apt-get install wrk
    .venv-serve/bin/python scripts/serving_wrk.py --offline inference/resnet18_demo --rounds 5 --seconds 4 --connections 1,32 \\
        --contender "toolkit=http://127.0.0.1:8080/v2/models/resnet18_demo/infer=tensor.json" \\
        --contender "triton=http://127.0.0.1:8094/v2/models/resnet18_demo/infer=tensor.json" \\
        --output benchmarks/serving_demo_wrk.json

wrk runs pinned to the last core (--load-core), the servers wherever the system puts them;
a slice that gets a non-2xx answer is marked. docs/measurements.md "Serving" quotes it."""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np

from paddle_resnet.core.config import build_config
from paddle_resnet.deploy import backends

LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
"""
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
OFFLINE_BATCHES = (1, 32)


def milliseconds(text):
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * UNITS[unit]


def cpu():
    """The CPU's name and its widest vector and matrix extensions, from /proc/cpuinfo."""
    with open("/proc/cpuinfo") as handle:
        text = handle.read()
    flags = set(re.search(r"^flags\s*:(.*)$", text, re.M)[1].split())
    extensions = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    name = re.search(r"^model name\s*:\s*(.*)$", text, re.M)[1]
    return f"{name}, {os.cpu_count()} cores ({', '.join(extensions)})"


def slice_of(url, script, connections, seconds, core):
    """One wrk run: requests/s, p50 and p99 in ms, non-2xx answers."""
    command = ["taskset", "-c", str(core), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s"]
    command += ["--latency", "-s", script, url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    percentile = {m[0]: milliseconds(m[1]) for m in re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M)}
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]),
        "p50_ms": percentile["50"],
        "p99_ms": percentile["99"],
        "non_2xx": int(non_2xx[1]) if non_2xx else 0,
    }


def offline_timer(directory):
    """A function timing the export's classifier at a batch size for ``seconds``."""
    config = build_config({"inference.model_dir": directory})
    classify, info, _, _ = backends.build_classifier(config.inference, max(OFFLINE_BATCHES))

    def timed(batch, seconds):
        images = np.random.default_rng(0).random([batch, *info["input_shape"]], np.float32)
        for _ in range(5):  # oneDNN's first calls prepare its primitives
            classify(images)
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            classify(images)
            times.append(time.perf_counter() - start)
        return {
            "images_per_s": batch * len(times) / sum(times),
            "p50_ms": 1000 * statistics.median(times),
        }

    return timed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contender", action="append", required=True, help="NAME=URL=BODY")
    parser.add_argument("--connections", default="1,32", help="requests in flight, each")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4, help="each slice")
    parser.add_argument("--load-core", type=int, default=os.cpu_count() - 1)
    parser.add_argument("--offline", metavar="DIR", help="an export to time offline too")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    offline = offline_timer(args.offline) if args.offline else None
    contenders = [spec.split("=", 2) for spec in args.contender]
    with tempfile.TemporaryDirectory() as folder:
        scripts = {}
        for name, _, body in contenders:
            scripts[name] = os.path.join(folder, f"{name}.lua")
            with open(scripts[name], "w") as handle:
                handle.write(LUA.format(body=os.path.abspath(body)))
        slices = []
        for connections in map(int, args.connections.split(",")):
            for round_ in range(args.rounds):
                for name, url, _ in contenders:
                    figures = slice_of(
                        url, scripts[name], connections, args.seconds, args.load_core
                    )
                    slices.append(dict(contender=name, connections=connections, round=round_))
                    slices[-1].update(figures)
                    print(json.dumps(slices[-1]), flush=True)
                for batch in OFFLINE_BATCHES if offline else ():
                    slices.append(dict(contender=f"offline batch {batch}", round=round_))
                    slices[-1].update(offline(batch, args.seconds))
                    print(json.dumps(slices[-1]), flush=True)
    groups = {}
    for row in slices:
        groups.setdefault((row["contender"], row.get("connections")), []).append(row)
    medians = []
    for (name, connections), group in groups.items():
        keys = [key for key in group[0] if key.endswith(("_per_s", "_ms", "non_2xx"))]
        medians.append(dict(contender=name, connections=connections))
        medians[-1].update({key: statistics.median(row[key] for row in group) for key in keys})
    result = {
        "command": "scripts/serving_wrk.py " + " ".join(f"--contender {c}" for c in args.contender),
        "cpu": cpu(),
        "date": time.strftime("%Y-%m-%d"),
        "medians": medians,
        "slices": slices,
    }
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=1)
    for row in medians:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
