from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import contextlib
import glob
import importlib.util
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from paddle_resnet.commands import train
from paddle_resnet.core import bootstrap, devices, paddle_internals
from paddle_resnet.core.config import build_config
from paddle_resnet.data.fashion_mnist import write_tree
from paddle_resnet.training import cpu_kernels
from paddle_resnet.training.checkpoint import read_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The CPU kernels of runs that name none: oneDNN, not measured per run (a measurement's
# choice could differ between runs on a loaded machine). tests/test_cpu_kernels.py measures.
os.environ.setdefault(cpu_kernels.PIN_VARIABLE, "onednn")

PADDLE3 = paddle_internals.PADDLE3
# The slowest tests whose Paddle-facing code other tests run on both versions: they run
# once, on the pinned 2.6.2, to keep the whole suite within CI's time (the two versions
# run one after the other; scripts/test.sh).
once = pytest.mark.skipif(
    PADDLE3 and not bootstrap.pir_only(),
    reason="version-independent beyond the tests that run "
    "on both versions; run once, on Paddle 2.6.2 (and in the PIR-only rehearsal)",
)
# What users do, run again on Paddle 3 with the legacy IR unavailable (scripts/test.sh's
# rehearsal track: PADDLE_RESNET_PIR_ONLY=1 pytest -m pir_rehearsal); the Paddle 3
# track leaves them to it.
pir_rehearsal = pytest.mark.pir_rehearsal

# Markers chosen by the machine and the Paddle build (pytest.ini lists them):
#   gpu         needs a usable NVIDIA GPU (the GPU counterparts of the cpu_only tests)
#   cpu_only    checks behaviour without a GPU (refusals, the CPU fallback)
#   cuda_build  builds GPU programs: needs paddlepaddle-gpu, with or without a GPU
#   gpu_wheel   also run on the GPU build on a CPU-only machine (scripts/test.sh's third
#               track runs -m "gpu_wheel or cuda_build" in .venv-gpu): the code whose
#               behaviour can differ on that build
SKIP_REASONS = {
    "gpu": None if devices.gpu_available() else f"needs an NVIDIA GPU: {devices.why_no_gpu()}",
    "cpu_only": (
        "checks the behaviour without a GPU, and this machine has one"
        if devices.gpu_available()
        else None
    ),
    "cuda_build": None
    if devices.cuda_build()
    else (
        "builds GPU programs: needs the GPU build of Paddle (paddlepaddle-gpu; scripts/test.sh "
        "runs these in .venv-gpu)"
    ),
}


# Every process the suite starts inherits this mark in its environment: at the end, one
# still alive is a process a test left behind (a rank that outlived its job outlives a
# user's job too). Set by the controlling pytest process; its xdist workers inherit it.
SESSION_MARK = "PADDLE_RESNET_TEST_SESSION"
LEFT_BEHIND_GRACE_SECONDS = 15


def pytest_configure(config):
    os.environ.setdefault(SESSION_MARK, f"{os.getpid()}-{time.time_ns()}")


def marked_processes(mark):
    """{pid: command line} of the processes whose environment holds ``mark``, but this one
    and its xdist workers (ending with it)."""
    found = {}
    needle = f"{SESSION_MARK}={mark}\0".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                variables = environ.read() + b"\0"
            if needle not in variables:
                continue
            with open(f"/proc/{entry}/stat") as stat:
                state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        worker = int(parent) == os.getpid() and b"\0PYTEST_XDIST_WORKER=" in b"\0" + variables
        if state != "Z" and not worker:
            found[int(entry)] = command.strip()
    return found


def pytest_sessionfinish(session, exitstatus):
    """The suite fails if a process it started is still alive at its end (after a grace
    for those ending now); they are listed and killed."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks
        return
    mark = os.environ[SESSION_MARK]
    deadline = time.monotonic() + LEFT_BEHIND_GRACE_SECONDS
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = marked_processes(mark)
    if not left:
        return
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    listing = "\n".join(f"  {pid}: {command[:200]}" for pid, command in sorted(left.items()))
    print(
        f"\nerror: {len(left)} process(es) started by the tests outlived them (killed now):\n{listing}"
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Where the suite's CPU time goes (it is CPU-bound on two cores): with this variable set,
# each test appends one JSON line, its CPU seconds (this worker's and the children it
# reaped: the runs, launchers and ranks it started) and wall seconds, fixtures it built
# included, and the worker's resident memory after it (what limits the workers to two).
# scripts/suite_cpu.py sums them by file and track.
CPU_LOG = os.environ.get("PADDLE_RESNET_TEST_CPU_LOG")


def cpu_seconds():
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def resident_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    cpu, wall = cpu_seconds(), time.monotonic()
    yield
    line = {
        "test": item.nodeid,
        "track": os.path.basename(sys.prefix) + ("-pir-only" if bootstrap.pir_only() else ""),
        "cpu": round(cpu_seconds() - cpu, 2),
        "wall": round(time.monotonic() - wall, 2),
        "rss_mb": resident_mb(),
    }
    with open(CPU_LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, reason in SKIP_REASONS.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


TRAIN_PER_CLASS = 16  # 160 training images: 10 steps of 16
VAL_PER_CLASS = 13  # 130 validation images: not a multiple of the batch size


@pytest.fixture(scope="session")
def fmnist_root(tmp_path_factory):
    """A small real image tree: Fashion-MNIST JPEGs, 10 classes."""
    root = str(tmp_path_factory.mktemp("data") / "fashion_mnist")
    return write_tree(root, TRAIN_PER_CLASS, VAL_PER_CLASS, log=lambda _: None)


@pytest.fixture(scope="session")
def imagenet_root(tmp_path_factory):
    """The 20 ImageNet validation JPEGs (512x512) that the foolbox wheel ships."""
    # Located without importing foolbox, whose own dependencies are not installed.
    package = importlib.util.find_spec("foolbox").submodule_search_locations[0]
    files = sorted(glob.glob(os.path.join(package, "data", "imagenet_*.jpg")))
    assert len(files) == 20
    root = tmp_path_factory.mktemp("imagenet")
    for path in files:
        label = int(os.path.basename(path).split("_")[2].split(".")[0])
        folder = root / "val" / f"n{label:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder)
    return str(root)


# train.py's flags for a run of seconds: ResNet-18 on 32-pixel crops, one epoch.
FAST_TRAIN = (
    "--model-arch-name resnet18 --num-of-class 10 --crop-size 32 --resize-short 32 "
    "--batch-size 16 --epochs 1 --warmup-epochs 0"
).split()


def train_command(fmnist_root, output_dir, *extra):
    """``python train.py`` of a 2-epoch run of 10 steps per epoch, logging every step: the
    run that tests stop, kill and restart."""
    return [
        sys.executable,
        "-u",
        "train.py",
        *FAST_TRAIN[:-4],  # without --epochs 1 --warmup-epochs 0
        "--epochs",
        "2",
        "--warmup-epochs",
        "0",
        "--print-interval",
        "1",
        "--dali-num-threads",
        "1",
        "--image-root",
        fmnist_root,
        "--output-dir",
        str(output_dir),
        *extra,
    ]


# the driver that holds a run at a step for its signal, and the line it prints there
HELD_TRAIN = os.path.join("tests", "ranks", "held_train.py")
HELD = "held at global step "


def interrupted(command, number, at_step):
    """Run ``command`` (train.py's) through tests/ranks/held_train.py, held after the step
    that reaches global step ``at_step``; send it ``number`` there, then release it (a
    SIGTERM'd run saves at that step). (exit code, output)."""
    held = [command[0], "-u", HELD_TRAIN, *command[command.index("train.py") + 1 :]]
    job = subprocess.Popen(
        held,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, HOLD_AT_STEP=str(at_step)),
    )
    lines = []
    for line in job.stdout:
        lines.append(line)
        if line.startswith(HELD):
            job.send_signal(number)
            with contextlib.suppress(BrokenPipeError):  # SIGKILL: nobody reads it
                job.stdin.write("go\n")
                job.stdin.flush()
    return job.wait(timeout=300), "".join(lines)


def train_args(image_root, output_dir, *extra):
    """train.py and its flags (no interpreter) for the runs the resume, oneDNN and
    data-parallel tests compare: ResNet-18 at 32 px, batch 16, LR 0.4 after half an epoch
    of warm-up, momentum 0.9, one DALI thread; ``extra`` says how many epochs."""
    return [
        "train.py",
        *FAST_TRAIN[:-4],  # without --epochs 1 --warmup-epochs 0
        *("--warmup-epochs", "0.5", "--lr", "0.4", "--momentum", "0.9"),
        *("--dali-num-threads", "1", "--print-interval", "5"),
        *("--image-root", image_root, "--output-dir", str(output_dir)),
        *extra,
    ]


def straight_and_resumed(fmnist_root, tmp_path, *flags):
    """``train_args``'s run of ``flags`` straight, and again resumed from the straight
    run's epoch-1 checkpoint, each a fresh process of two math threads (as a single
    process on two cores: scripts/test.sh runs the rest at one): (straight folder,
    resumed folder, the resumed run's stdout)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for out, extra in (
        (straight, ()),
        (resumed, ("--from-checkpoint", str(straight / "resnet18" / "1"))),
    ):
        result = subprocess.run(
            [sys.executable, *train_args(fmnist_root, out, *flags, *extra)],
            cwd=ROOT,
            env=dict(os.environ, OMP_NUM_THREADS="2"),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-2000:]
    return straight, resumed, result.stdout


@pytest.fixture(scope="session")
def uninterrupted(fmnist_root, tmp_path_factory):
    """The final checkpoint's state of ``train_command``'s run never stopped, which every
    stopped, killed or requeued run of it must equal bit for bit."""
    out = tmp_path_factory.mktemp("uninterrupted")
    result = subprocess.run(
        train_command(fmnist_root, out), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return read_checkpoint(os.path.join(out, "resnet18", "2"))[1]


def random_seed():
    """A fresh seed for a test's random moments, or RANDOM_MOMENTS_SEED to replay the one
    a failure named."""
    return int(os.environ.get("RANDOM_MOMENTS_SEED", random.randrange(1 << 30)))


def assert_same_state(actual, expected):
    """Two checkpoints' states hold the same variables with bit-identical values."""
    assert set(actual) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def small_config(image_root, output_dir, **values):
    """A fast CPU configuration: ResNet-18 on 32-pixel crops, batch 16. On Paddle 3 on the
    legacy IR unless ``values`` name one (the rehearsal: PIR): there the suite keeps testing
    the legacy IR users can still choose, its tests of PIR name PIR, and the default choice
    (PIR) has tests of its own (test_pir) and runs in the tests that start train.py bare."""
    legacy_on_paddle3 = paddle_internals.PADDLE3 and not bootstrap.pir_only()
    base = {
        "run.ir": "legacy" if legacy_on_paddle3 else None,
        "model.arch": "resnet18",
        "model.num_classes": 10,
        "data.image_root": image_root,
        "data.batch_size": 16,
        "data.crop_size": 32,
        "data.resize_short": 32,
        "data.num_threads": 2,
        "lr.base": 0.8,
        "lr.warmup_epochs": 0.0,
        "optimizer.momentum": 0.9,
        "run.epochs": 2,
        "run.output_dir": str(output_dir),
        "run.print_interval": 5,
    }
    base.update(values)
    return build_config(base)


@pytest.fixture(scope="session")
def trained(fmnist_root, tmp_path_factory):
    """Three epochs of ResNet-18 on 160 real images; its checkpoints serve many tests."""
    config = small_config(fmnist_root, tmp_path_factory.mktemp("trained"), **{"run.epochs": 3})
    train.run(config, report_stream=open(os.devnull, "w"))
    return config


def run_command(command, **env):
    """``command`` from the repository's root, as a user runs a tool, with ``env`` added
    to this process's environment: its output and exit status."""
    return subprocess.run(
        command,
        cwd=ROOT,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def launch(args, log_dir, nproc=2, launcher=(), timeout=300, env=None):
    """``python -m paddle.distributed.launch`` as users run it (``env`` added to this
    process's environment); returns the finished process."""
    command = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--nproc_per_node",
        str(nproc),
        "--log_dir",
        str(log_dir),
        *launcher,
        *args,
    ]
    return subprocess.run(
        command,
        cwd=ROOT,
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(result):
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return result


def training_into(out, script="train.py"):
    """The process ids of the ``script`` processes (ranks or a lone run, not a launcher)
    writing into ``out``."""
    found = subprocess.run(["pgrep", "-f", f"{script} .*{out}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def run_python(*argv):
    """``python *argv`` from the repository's root, as a user runs a tool."""
    return run_command([sys.executable, *argv])


def train_in_fresh_process(config):
    """``train.run(config)`` in a new Python process: runs whose weights are compared bit for
    bit must not share a process with an earlier Paddle Inference run, which leaves MKL and
    OpenMP on one thread (``eval_predictor``: the toolkit's own predictor gives them back;
    the tests' predictors do not)."""
    path = os.path.join(config.run.output_dir, "config.json")
    os.makedirs(config.run.output_dir, exist_ok=True)
    with open(path, "w") as handle:
        json.dump(flat(config), handle)
    code = (
        "import json, os, sys; from paddle_resnet.core import bootstrap; "
        "bootstrap.prepare_process([]); from paddle_resnet.commands import train; "
        "from paddle_resnet.core.config import build_config; "
        "train.run(build_config(json.load(open(sys.argv[1]))), report_stream=open(os.devnull, 'w'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, path], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]


def flat(config):
    """A Config as the {"section.key": value} mapping build_config takes."""
    return config.flat()
