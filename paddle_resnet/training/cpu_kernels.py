"""Plain or oneDNN training kernels on the CPU (``onednn.py``), measured on the machine
that trains: which is faster depends on the CPU as much as on the shapes (ResNet-50 at
224 px trained 1.93x faster on oneDNN on an AVX2 EPYC, 0.83x on an AMX Xeon).

Where ``--cpu-onednn`` is not given, a fresh process (so that the training process has
run no step before its first) times this run's train program both ways in alternating
slices (``core/interleave.py``); the faster is taken, and kept in the user's cache
(``$XDG_CACHE_HOME/paddle-resnet/cpu_kernels.json``) per ``cache_key``.
``PADDLE_RESNET_CPU_KERNELS=onednn|plain`` takes one without measuring (the test suite);
multi-process jobs do not measure (their ranks would have to agree): plain kernels.
"""

import dataclasses
import json
import os
import sys

import numpy as np
import paddle

from paddle_resnet.core import (
    atomic,
    bootstrap,
    child_process,
    devices,
    feeds,
    interleave,
    paddle_internals,
    provenance,
)
from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import UserError
from paddle_resnet.models import model_entry
from paddle_resnet.training import ir, prepare
from paddle_resnet.training.onednn import onednn_wanted
from paddle_resnet.training.programs import input_shape

PIN_VARIABLE = "PADDLE_RESNET_CPU_KERNELS"
PIN_VALUES = {"onednn": True, "plain": False}
CACHE_FILE = "cpu_kernels.json"
# Why a choice was not measured, as its line says.
UNMEASURED = {
    "pinned": f"{PIN_VARIABLE} says so",
    "multi-process": "a multi-process job does not measure them; --cpu-onednn for oneDNN",
    "failed": "their measurement failed; --cpu-onednn for oneDNN",
}
# Slices of the measurement: each kernel path this often, for about this many seconds.
ROUNDS, SLICE_SECONDS = 3, 1.0
# A measurement taken while the 1-minute load average exceeded this share of the cores
# this process may use is used for the run but not kept: another job shared the cores.
LOADED = 0.5


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a run without --cpu-onednn / --no-cpu-onednn trains on, and why."""

    onednn: bool
    how: str  # "measured", "cached", or a key of UNMEASURED
    plain_ips: float = None
    onednn_ips: float = None
    kept: str = None  # a measurement's fate: "kept in <cache>", or "not kept: <why>"

    @property
    def name(self):
        return "oneDNN" if self.onednn else "plain"

    def line(self):
        if self.how not in ("measured", "cached"):
            return f"CPU kernels: {self.name} ({UNMEASURED[self.how]})"
        now = self.how == "measured"
        when = f"measured now ({self.kept})" if now else f"measured before ({cache_path()})"
        return (
            f"CPU kernels: {self.name}, {when}: oneDNN {self.onednn_ips:.1f} img/s, plain "
            f"{self.plain_ips:.1f} (--cpu-onednn / --no-cpu-onednn to choose)"
        )

    def record(self):
        return dataclasses.asdict(self)


def resolved(config, world_size):
    """(``config`` with ``run.cpu_onednn`` decided, the Choice or None where not ours)."""
    if onednn_wanted(config) is not None:
        return config, None
    pin = os.environ.get(PIN_VARIABLE)
    if pin in PIN_VALUES:
        choice = Choice(PIN_VALUES[pin], "pinned")
    elif world_size > 1:
        choice = Choice(False, "multi-process")
    else:
        choice = _cached_or_measured(config)
    run = dataclasses.replace(config.run, cpu_onednn=choice.onednn)
    return dataclasses.replace(config, run=run), choice


def cache_key(config):
    """What a measurement holds for: the CPU, the code, the allocator, the model, the
    input, the batch and the threads."""
    model, data = config.model, config.data
    shape = "x".join(map(str, input_shape(config)))
    code = provenance.code()
    onednn_ops = ",".join(model_entry(model.arch).family.onednn_training_ops)
    return (
        f"{devices.cpu_model()} {_isa()} | Paddle {paddle.__version__} | paddle-resnet "
        f"{code['toolkit']} {code.get('commit', '')[:12]} | {ir.chosen(config)[0]} | "
        f"{bootstrap.allocator()} | {model.arch} {model.num_classes} classes, oneDNN ops "
        f"{onednn_ops} | {shape} {model.data_layout} | batch {data.batch_size} | "
        f"{os.environ.get('OMP_NUM_THREADS', '?')} threads"
    )


def _isa():
    """The widest instruction set oneDNN can use here (a virtual machine's model name may
    hide it: "Intel(R) Xeon(R) Processor")."""
    flags = devices.cpu_flags()
    for name, flag in (("AMX", "amx_bf16"), ("AVX-512", "avx512f"), ("AVX2", "avx2")):
        if flag in flags:
            return name
    return "SSE"


def cache_path():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "paddle-resnet", CACHE_FILE)


def _read_cache(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):  # none yet, or unreadable: measured again
        return {}


def _cached_or_measured(config):
    path, key = cache_path(), cache_key(config)
    known = _read_cache(path).get(key)
    if known:
        return _faster(known, "cached")
    loaded = os.getloadavg()[0] > LOADED * available_cores()
    speeds = measure(config)
    if speeds is None:
        return Choice(False, "failed")
    if loaded or _apart(speeds) is False:
        why = "the machine was busy" if loaded else "the two speeds are within their spread"
        return _faster(speeds, "measured", kept=f"not kept: {why}")
    entries = dict(_read_cache(path), **{key: speeds})
    try:
        with atomic.atomic_files(path) as (handle,):
            handle.write(json.dumps(entries, indent=1, sort_keys=True).encode())
    except OSError as err:  # a read-only home: measured again next time
        return _faster(speeds, "measured", kept=f"not kept: {err.strerror}")
    return _faster(speeds, "measured", kept=f"kept in {path}")


def _apart(speeds):
    """Whether one path was faster in every round (paired slice ratios all on one side of
    1: a round's load cancels); None where the slices were not recorded."""
    if "plain_slices" not in speeds:
        return None
    ratios = interleave.paired_ratio(speeds["onednn_slices"], speeds["plain_slices"])
    return ratios["min"] > 1 or ratios["max"] < 1


def _faster(speeds, how, kept=None):
    """The Choice of the faster path by ``speeds`` (a measurement or a cache entry)."""
    plain, onednn = speeds["plain_ips"], speeds["onednn_ips"]
    return Choice(onednn > plain, how, plain_ips=plain, onednn_ips=onednn, kept=kept)


def measure(config):
    """{"plain_ips", "onednn_ips"} timed in a fresh process (``main``); None if it failed
    (its error is not the run's)."""
    try:
        out = child_process.run(
            ["-m", __name__], "the kernel measurement failed", stdin=json.dumps(config.flat())
        )
    except UserError:
        return None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _slice(config, onednn):
    """A slice function (``interleave.alternate``) stepping ``config``'s train program on
    the kernels asked for, in a scope of its own, after one warm-up step."""
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, cpu_onednn=onednn))
    scope = paddle.static.Scope()
    batch = config.data.batch_size
    with paddle.static.scope_guard(scope):
        programs, exe = prepare.ready_for_weights(
            config, True, 1, 1000, paddle_internals.current_place()
        )
    rng = np.random.default_rng(0)
    feed = {
        feeds.IMAGE: rng.standard_normal([batch, *input_shape(config)]).astype("float32"),
        feeds.LABEL: rng.integers(0, config.model.num_classes, (batch, 1)).astype("int64"),
    }
    if programs.mixup_feed:
        feed[programs.mixup_feed] = np.array([0.5], "float32")
    for name in programs.class_feeds:  # class weights, logit offsets: any values time alike
        feed[name] = np.ones(config.model.num_classes, "float32")
    fetch = [programs.train_fetches["loss"]]

    def step():
        with paddle.static.scope_guard(scope):
            exe.run(programs.train, feed=feed, fetch_list=fetch)

    step()
    return lambda seconds: interleave.run_slice(step, batch, seconds)


def main():
    """The measuring process: ``Config.flat()`` JSON on stdin, one JSON line out."""
    config = build_config(json.load(sys.stdin), source="the kernel measurement")
    paddle.enable_static()
    with ir.selected(config):
        slices = {"plain": _slice(config, False), "onednn": _slice(config, True)}
        speeds = interleave.alternate(slices, ROUNDS, SLICE_SECONDS)
    figures = {f"{name}_ips": interleave.median_speed(s) for name, s in speeds.items()}
    figures.update({f"{name}_slices": s for name, s in speeds.items()})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
