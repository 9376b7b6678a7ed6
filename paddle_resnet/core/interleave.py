"""Speeds that survive a shared host: the contenders take turns in short slices (A B A B
..., a few seconds each), and a comparison is the median of the paired per-slice ratios,
with their spread, rather than a ratio of two medians taken minutes apart. A contender is
a function running one step (``run_slice``), or a process of its own serving slices over
its standard input and output (``SliceWorker``, ``serve_slices``), so that PyTorch and
Paddle, or two Paddle versions, never share a process.
"""

import json
import subprocess
import sys
import time

import numpy as np

READY = "ready"


def run_slice(step, images_per_step, seconds):
    """Images per second of ``step()`` repeated for ``seconds`` (at least one step)."""
    start, steps = time.perf_counter(), 0
    while True:
        step()
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return images_per_step * steps / elapsed


def alternate(contenders, rounds, seconds):
    """{name: [img/s of each slice]} of ``contenders`` ({name: slice(seconds) -> img/s})."""
    speeds = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            speeds[name].append(run(seconds))
    return speeds


def paired_ratio(numerator, denominator):
    """{"median", "min", "max", "ratios"} of two contenders' slice-by-slice speed ratios."""
    ratios = [a / b for a, b in zip(numerator, denominator)]
    return {
        "median": round(float(np.median(ratios)), 3),
        "min": round(min(ratios), 3),
        "max": round(max(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
    }


def median_speed(speeds):
    return round(float(np.median(speeds)), 2)


def serve_slices(step, images_per_step, info=None):
    """A contender process's side: ``ready`` (with ``info``), then a slice's img/s per line."""
    print(json.dumps({READY: True, **(info or {})}), flush=True)
    for line in sys.stdin:
        seconds = float(line)
        print(json.dumps({"ips": run_slice(step, images_per_step, seconds)}), flush=True)


class SliceWorker:
    """A contender in a process of its own (``command`` ends in ``serve_slices``); call it
    with seconds for a slice's img/s. RuntimeError with the end of its stderr if it dies."""

    def __init__(self, command, env=None):
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.info = self._answer()

    def _answer(self):
        line = self.process.stdout.readline()
        while line and not line.startswith("{"):  # a library's own chatter on stdout
            line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            tail = self.process.stderr.read().strip().splitlines()[-5:]
            raise RuntimeError(f"{self.process.args[1:4]} ended: " + " | ".join(tail))
        return json.loads(line)

    def __call__(self, seconds):
        self.process.stdin.write(f"{seconds}\n")
        self.process.stdin.flush()
        return self._answer()["ips"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()
