"""Data parallelism with real processes: ``paddle.distributed.launch`` starts CPU ranks that
talk through gloo, along Fleet's own collective path (Paddle 2.6 and 3.x)."""

import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from conftest import (
    HELD,
    HELD_TRAIN,
    PADDLE3,
    ROOT,
    assert_same_state,
    launch,
    ok,
    once,
    pir_rehearsal,
    random_seed,
    train_args,
    training_into,
)
from paddle_resnet.commands import train
from paddle_resnet.core import devices
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import RESTARTABLE
from paddle_resnet.core.report import read_report
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import run_folder
from paddle_resnet.training.optim import lr_at_step

TOY = os.path.join(ROOT, "tests", "ranks", "toy_reduction.py")
# CPU ranks over gloo: on GPU machines the launcher gives each rank a GPU (NCCL), whose
# counterpart is tests/test_gpu.py. (Hiding the GPUs with CUDA_VISIBLE_DEVICES="" makes
# the launcher itself fail: it reads its device list from there.)
pytestmark = pytest.mark.cpu_only


def weights(output_dir, epoch):
    return ckpt.read_checkpoint(run_folder.checkpoint_dir(str(output_dir), "resnet18", epoch))[1]


@pytest.fixture(scope="module")
def two_ranks(fmnist_root, tmp_path_factory):
    """Two CPU ranks, two epochs, 160 training images: 5 steps of 2 x 16 per epoch."""
    out = tmp_path_factory.mktemp("two_ranks")
    ok(launch(train_args(fmnist_root, out, "--epochs", "2"), out / "logs"))
    return out


# AMP on CPU ranks: the CPU build adds the loss scaling alone; the GPU build's fp16 casts
# have no CPU kernels (its 2-rank AMP job: tests/test_gpu.py).
@pytest.mark.parametrize(
    "amp",
    [
        False,
        pytest.param(
            True,
            marks=[
                once,
                pytest.mark.skipif(
                    devices.cuda_build(), reason="the GPU build's fp16 casts have no CPU kernels"
                ),
            ],
        ),
    ],
)
def test_gradients_are_averaged_across_ranks(tmp_path, amp):
    """Every rank ends equal to one process on the whole batch: a sum would double the
    steps, no reduction would leave the ranks apart. With AMP an infinite gradient on
    one rank makes every rank skip the step."""
    flags = ["--amp"] if amp else []
    ok(
        subprocess.run(
            [sys.executable, TOY, str(tmp_path / "one"), *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    )
    ok(launch([TOY, str(tmp_path / "two"), *flags], tmp_path / "logs"))
    one, rank0, rank1 = (
        np.load(tmp_path / name) for name in ("one.0.npz", "two.0.npz", "two.1.npz")
    )
    ops = list(rank0["ops"])
    all_reduce = "all_reduce" if PADDLE3 else "c_allreduce_sum"  # 3.x: the phi op
    assert all_reduce in ops and "coalesce_tensor" in ops  # fused all-reduce
    assert not {"c_sync_comm_stream", "c_sync_calc_stream"} & set(ops)
    if amp:
        # The gradients are summed before the finite check, so every rank sees the same
        # found-inf flag: an overflow on one rank skips the step on all of them.
        assert ops.index(all_reduce) < ops.index("check_finite_and_unscale")
        assert "update_loss_scaling" in ops
    for name in ("linear_0.w_0", "linear_0.b_0"):
        np.testing.assert_array_equal(rank0[name], rank1[name])
        np.testing.assert_allclose(rank0[name], one[name], rtol=1e-6, atol=1e-7)
        assert np.isfinite(rank0[name]).all()


@pytest.mark.skipif(not PADDLE3, reason="PIR needs Paddle 3")
def test_gradients_are_averaged_across_ranks_on_pir(tmp_path):
    """On PIR, where Fleet's collective strategy cannot build, the toolkit's own gradient
    all-reduce: both ranks equal one process on the whole batch."""
    run = [sys.executable, TOY, str(tmp_path / "one"), "--pir"]
    ok(subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120))
    ok(launch([TOY, str(tmp_path / "two"), "--pir"], tmp_path / "logs"))
    one, rank0, rank1 = (
        np.load(tmp_path / name) for name in ("one.0.npz", "two.0.npz", "two.1.npz")
    )
    assert "all_reduce_" in list(rank0["ops"]) and "all_reduce_" not in list(one["ops"])
    for name in ("linear_0.w_0", "linear_0.b_0"):
        np.testing.assert_array_equal(rank0[name], rank1[name])
        np.testing.assert_allclose(rank0[name], one[name], rtol=1e-6, atol=1e-7)


@pir_rehearsal
def test_two_ranks_train_with_agreeing_parameters_and_exact_evaluation(two_ranks):
    records = read_report(str(two_ranks / "report.json"))
    assert [r["type"] for r in records].count("PARAMETER") == 1  # rank 0 alone wrote it
    ranks = [r for r in records if r["type"] == "RANKS"]
    assert [r["step"] for r in ranks] == [[1], [2]]
    assert all(r["data"]["world_size"] == 2 for r in ranks)
    val = [r["data"] for r in records if r["type"] == "VAL"]
    assert [v["val.images"] for v in val] == [130, 130]  # every image once, 130 = 2 x 65
    steps = [r for r in records if r["type"] == "LOG"]
    assert steps[-1]["data"]["progress"] == "5/5"
    meta, _ = ckpt.read_checkpoint(run_folder.checkpoint_dir(str(two_ranks), "resnet18", 2))
    assert meta["world_size"] == 2 and meta["global_step"] == 10


@once
def test_two_rank_evaluation_equals_one_rank(two_ranks, fmnist_root, tmp_path):
    """130 validation images: 65 per rank, batches of 16, the last one partial."""
    results = {}
    for nproc in (1, 2):
        out = tmp_path / f"eval{nproc}"
        ok(
            launch(
                train_args(
                    fmnist_root,
                    out,
                    "--run-scope",
                    "eval_only",
                    "--from-checkpoint",
                    str(two_ranks / "resnet18" / "2"),
                ),
                out / "logs",
                nproc=nproc,
            )
        )
        results[nproc] = [
            r["data"] for r in read_report(str(out / "report.json")) if r["type"] == "VAL"
        ][0]
    one, two = results[1], results[2]
    assert two["val.images"] == one["val.images"] == 130
    assert two["val.top1"] == one["val.top1"] and two["val.top5"] == one["val.top5"]
    # Per-image float32 losses: a batch of another size may take another GEMM blocking on
    # some CPUs (seen on an AVX2-only EPYC: 2e-8 relative).
    assert two["val.loss"] == pytest.approx(one["val.loss"], rel=1e-6)


@pir_rehearsal
@once
def test_resume_with_two_ranks_continues_exactly(two_ranks, fmnist_root, tmp_path):
    """Epoch 2 resumed from the two-rank run's epoch-1 checkpoint, in new processes,
    equals the uninterrupted run bit for bit."""
    out = tmp_path / "resumed"
    result = ok(
        launch(
            train_args(
                fmnist_root,
                out,
                "--epochs",
                "2",
                "--from-checkpoint",
                str(two_ranks / "resnet18" / "1"),
            ),
            tmp_path / "logs",
        )
    )
    assert "resumed from" in result.stdout
    assert_same_state(weights(out, 2), weights(two_ranks, 2))


@once
def test_two_nodes_on_one_host_equal_two_local_ranks(two_ranks, fmnist_root, tmp_path):
    """Each "node" on its half of the cores (taskset): its one rank then has the math
    threads each of two local ranks has (the cores shared by the ranks of a host), so the
    two jobs compute alike."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    halves = [cores[:half], cores[half : 2 * half] or cores[:half]]
    out = tmp_path / "nodes"
    nodes = [
        subprocess.Popen(
            [
                "taskset",
                "-c",
                ",".join(map(str, halves[node])),
                sys.executable,
                "-m",
                "paddle.distributed.launch",
                "--nnodes",
                "2",
                "--master",
                f"127.0.0.1:{port}",
                "--rank",
                str(node),
                "--nproc_per_node",
                "1",
                "--log_dir",
                str(tmp_path / f"logs{node}"),
                *train_args(fmnist_root, out, "--epochs", "2"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert_same_state(weights(out, 2), weights(two_ranks, 2))


@once
def test_resume_across_world_sizes_keeps_the_epoch_schedule(two_ranks, fmnist_root, tmp_path):
    """2 -> 1 rank: an epoch has 10 steps instead of 5 and the global batch halves; the
    LR continues at epoch 1 of the schedule, linearly scaled to the new global batch."""
    out = tmp_path / "one_rank"
    result = ok(
        launch(
            train_args(
                fmnist_root,
                out,
                "--epochs",
                "2",
                "--run-scope",
                "train_only",
                "--from-checkpoint",
                str(two_ranks / "resnet18" / "1"),
            ),
            tmp_path / "logs",
            nproc=1,
        )
    )
    assert "trained by 2 rank(s), this run has 1: 10 steps per epoch" in result.stdout
    lr_config = build_config({"lr.base": 0.4, "lr.warmup_epochs": 0.5, "run.epochs": 2}).lr
    logged = {
        r["step"][1]: r["data"]["lr"]
        for r in read_report(str(out / "report.json"))
        if r["type"] == "LOG"
    }
    assert logged, "the resumed run logged no step"
    for step, lr in logged.items():  # step counts from 1 within epoch 2
        assert lr == pytest.approx(lr_at_step(lr_config, 10 + step - 1, 10, 2, 16))
    meta, _ = ckpt.read_checkpoint(run_folder.checkpoint_dir(str(out), "resnet18", 2))
    assert meta["world_size"] == 1 and meta["global_step"] == 20
    # 1 -> 2 ranks: the run's last checkpoint leaves no epoch to train, but the resume
    # itself (restore, schedule position, the world-size notice) runs with two ranks.
    back = tmp_path / "two_again"
    result = ok(
        launch(
            train_args(
                fmnist_root,
                back,
                "--epochs",
                "2",
                "--run-scope",
                "train_only",
                "--from-checkpoint",
                str(out / "resnet18" / "2"),
            ),
            tmp_path / "logs2",
        )
    )
    assert "trained by 1 rank(s), this run has 2: 5 steps per epoch" in result.stdout


def ranks_of(out, rank=""):
    """The process ids of the ranks (or of rank ``rank``) training into ``out``, not their
    launcher's."""
    ranks = []
    for pid in training_into(out):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # ended meanwhile
            if f"PADDLE_TRAINER_ID={rank}" in open(f"/proc/{pid}/environ").read():
                ranks.append(pid)
    return ranks


def rank_1_pid(out):
    """The process id of rank 1 of the job training into ``out``."""
    victim = ranks_of(out, "1\0")
    assert len(victim) == 1, victim
    return victim[0]


def wait_for_epoch_1(out, job):
    """Until the job training into ``out`` has saved epoch 1."""
    first = out / "resnet18" / "1" / "meta.json"
    deadline = time.time() + 180
    while not first.exists() and time.time() < deadline and job.poll() is None:
        time.sleep(0.2)
    assert first.exists(), "no checkpoint was written"


def signal_rank_1(fmnist_root, tmp_path, signum, *flags):
    """A 2-rank job of many epochs; once epoch 1 is saved, rank 1 gets ``signum``. Returns
    (seconds until the job ended, the launcher's output, rank 0's log, the output folder,
    the launcher's exit status)."""
    out = tmp_path / "job"
    command = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--nproc_per_node",
        "2",
        "--log_dir",
        str(tmp_path / "logs"),
        *train_args(fmnist_root, out, "--epochs", "500", *flags),
    ]
    job = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wait_for_epoch_1(out, job)
    victim = rank_1_pid(out)
    signalled_at = time.time()
    os.kill(victim, signum)
    try:
        output = job.communicate(timeout=120)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)  # a stopped rank the launcher left
        job.kill()
    rank0 = (tmp_path / "logs" / "workerlog.0").read_text()
    return time.time() - signalled_at, output, rank0, out, job.returncode


def held_pid(log, job):
    """The process id the rank logging to ``log`` names once held at its step
    (tests/ranks/held_train.py), waited for while its launcher ``job`` runs."""
    deadline = time.time() + 180
    while time.time() < deadline and job.poll() is None:
        held = re.search(rf"{HELD}\d+ \(pid (\d+)\)", log.read_text() if log.exists() else "")
        if held:
            return int(held[1])
        time.sleep(0.05)
    raise AssertionError(f"the rank of {log} did not reach its hold point")


def held_rank_killed(fmnist_root, tmp_path, victim):
    """A 3-rank job (4 steps an epoch) whose rank ``victim`` holds after its 5th step, its
    first epoch saved (tests/ranks/held_train.py: the others wait for it in their next
    all-reduce), and is SIGKILLed there. (the launcher's status, {rank: its log}, the
    output folder) once every process ended."""
    logs, out = tmp_path / "logs", tmp_path / "job"
    args = ["tests/ranks/held_train.py", *train_args(fmnist_root, out, "--epochs", "2")[1:]]
    env = dict(
        os.environ,
        HOLD_RANK=str(victim),
        HOLD_AT_STEP="5",
        HOLD_RELEASE=str(tmp_path / "never"),
    )
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "3"]
    job = subprocess.Popen(
        [*command, "--log_dir", str(logs), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        os.kill(held_pid(logs / f"workerlog.{victim}", job), signal.SIGKILL)
        status = job.wait(timeout=120)
    finally:
        job.kill()
    return status, {rank: (logs / f"workerlog.{rank}").read_text() for rank in range(3)}, out


@once
def test_the_survivors_name_the_rank_that_was_killed(fmnist_root, tmp_path):
    """Three ranks, one SIGKILLed at a step (held there, so the moment is the test's):
    every survivor's one line names that rank, found by a roll call in the job's store
    (gloo says "std::exception"; the line said "one of ranks [0, 2]", at 16 ranks a list
    of 15); rank 0's death takes the store with it, which names rank 0. A lost peer is a
    crash a restart may fix: 75 (rank 0's status, the first in the launcher's rank
    order) where rank 0 lives, never 2, which would fail a Kubernetes Job; the
    checkpoints written stay intact."""
    for victim in (2, 0):
        status, logs, out = held_rank_killed(fmnist_root, tmp_path / str(victim), victim)
        assert status == RESTARTABLE if victim else status not in (0, 2), (victim, status)
        meta, _ = ckpt.read_checkpoint(str(out / "resnet18"))  # newest: intact, verified
        assert meta["epoch"] >= 1
        named = "rank 2 stopped" if victim == 2 else "rank 0 (the host of the job's key-value store"
        survivors = [rank for rank in range(3) if rank != victim]
        assert len(survivors) == 2
        for rank in survivors:
            lines = [line for line in logs[rank].splitlines() if line.startswith("error:")]
            assert len(lines) == 1 and "Traceback" not in logs[rank], (victim, rank, logs[rank])
            assert lines[0].startswith(f"error: rank {rank}: {named}"), (victim, lines[0])


@once
def test_a_stopped_rank_ends_the_job_within_the_collective_timeout(fmnist_root, tmp_path):
    """SIGSTOP: alive but stuck. Without the watchdog rank 0 waited in its all-reduce for
    gloo's hard-coded ~115 days."""
    seconds, output, rank0, out, status = signal_rank_1(
        fmnist_root, tmp_path, signal.SIGSTOP, "--collective-timeout", "8"
    )
    assert seconds < 8 + 30
    assert status == RESTARTABLE, output[-3000:]
    assert (
        "error: rank 0: no progress for " in rank0
        and "(--collective-timeout 8): rank 1 is stuck (stopped, or hung)" in rank0
    ), rank0[-2000:]
    assert "Traceback" not in output + rank0
    meta, _ = ckpt.read_checkpoint(str(out / "resnet18"))
    assert meta["epoch"] >= 1


@once
def test_the_ranks_end_with_their_launcher_when_it_is_killed(fmnist_root, tmp_path):
    """SIGKILL to paddle.distributed.launch alone (what the OOM killer may pick): its ranks,
    each in its own process group, end within seconds without saving, where they lived on
    as orphans holding the output folder's lock."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2"]
    command += ["--log_dir", str(logs), *train_args(fmnist_root, out, "--epochs", "50")]
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_for_epoch_1(out, job)
    assert len(ranks_of(out)) == 2
    before = sorted(os.listdir(out / "resnet18"))
    job.kill()
    job.wait()
    deadline = time.time() + 10
    while ranks_of(out) and time.time() < deadline:
        time.sleep(0.2)
    left = ranks_of(out)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "ranks outlived their launcher by 10 s"
    assert sorted(os.listdir(out / "resnet18")) == before  # nothing saved, nothing left half
    texts = [(logs / f"workerlog.{rank}").read_text() for rank in (0, 1)]
    gone = f": its launcher (pid {job.pid}) is gone: this rank ends too, without saving"
    # each rank says so, or (rank 0) that rank 1 ended first, whichever it saw first
    assert any(gone in text for text in texts), [text[-1500:] for text in texts]
    assert all("Traceback" not in text for text in texts)


@once
def test_more_ranks_than_batches_is_one_line(fmnist_root, tmp_path):
    result = launch(train_args(fmnist_root, tmp_path, "--batch-size", "96"), tmp_path / "logs")
    assert result.returncode != 0
    assert "160 training images give no full batch of 96 per rank on 2 rank(s)" in result.stdout


def test_incomplete_launcher_environment_is_one_line(fmnist_root, tmp_path):
    env = dict(os.environ, PADDLE_TRAINER_ENDPOINTS="127.0.0.1:6170,127.0.0.1:6171")
    env.pop("PADDLE_TRAINER_ID", None)
    result = subprocess.run(
        [sys.executable, *train_args(fmnist_root, tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: PADDLE_TRAINER_ENDPOINTS names 2 ranks but PADDLE_TRAINER_ID is not set; "
        "start the ranks with python -m paddle.distributed.launch"
    )


def test_sync_bn_is_refused_without_a_gpu(fmnist_root, tmp_path, capsys):
    """On CPU ranks Fleet keeps per-rank batch norm: the option would do nothing. (The
    converted program is built by the GPU build: tests/test_gpu_build.py.)"""
    assert train.main(train_args(fmnist_root, tmp_path, "--sync-bn")[1:]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: --sync-bn needs an NVIDIA GPU")
    )


@once
def test_a_refused_two_rank_resume_is_one_line_in_every_rank_log(two_ranks, fmnist_root, tmp_path):
    """The rank that refuses first ends the job; the launcher's SIGTERM made the other
    rank print three C++ "Termination signal" dumps and no line of its own."""
    result = launch(
        train_args(
            fmnist_root,
            two_ranks,
            "--epochs",
            "3",
            "--lr",
            "0.8",
            "--from-checkpoint",
            str(two_ranks / "resnet18"),
        ),
        tmp_path / "logs",
    )
    assert result.returncode != 0
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"workerlog.{rank}").read_text()
        lines = [line for line in log.splitlines() if line.strip() and "FLAGS" not in line]
        assert lines and all(line.startswith(("error: ", "warning: ")) for line in lines), log
        assert "Termination signal" not in log and "Traceback" not in log, log
    # every rank either refused the run itself or was stopped by the launcher, saying so
    logs = "".join((tmp_path / "logs" / f"workerlog.{r}").read_text() for r in (0, 1))
    assert "belongs to another run: lr.base: 0.4 -> 0.8" in logs


def signalled_job(fmnist_root, tmp_path, signum, to_launcher, *flags):
    """A 2-rank job; once rank 0 has logged epoch 1 step 1, ``signum`` goes to the
    launcher (as Kubernetes sends it) or to rank 1 alone. Returns (launcher's exit code,
    each rank's log, the stop line's (epoch, step) on each rank)."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    command = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--nproc_per_node",
        "2",
        "--log_dir",
        str(logs),
        *train_args(fmnist_root, out, "--print-interval", "1", *flags),
    ]
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    rank0 = logs / "workerlog.0"
    deadline = time.time() + 180
    while time.time() < deadline and job.poll() is None:
        if rank0.exists() and "epoch 1 step 1:" in rank0.read_text():
            break
        time.sleep(0.05)
    if to_launcher:
        job.send_signal(signum)
    else:
        os.kill(rank_1_pid(out), signum)
    try:
        job.communicate(timeout=180)
    finally:
        job.kill()
    texts = [(logs / f"workerlog.{rank}").read_text() for rank in (0, 1)]
    name = signal.Signals(signum).name
    stops = []
    for text in texts:
        assert "Traceback" not in text and "Termination signal" not in text, text[-3000:]
        line = [line for line in text.splitlines() if f"stopped by {name} in epoch " in line]
        assert len(line) == 1, text[-3000:]
        words = line[0].split(f"stopped by {name} in epoch ")[1].split()
        stops.append((int(words[0]), int(words[3]), line[0]))
    return job.returncode, texts, stops


def held_job(command, logs, signum, at_step, to_launcher):
    """Start the launcher ``command`` (its --log_dir ``logs``) with its training script
    swapped for tests/ranks/held_train.py, which holds the rank that is to get the signal
    (rank 0 for the launcher's, rank 1 for its own) after global step ``at_step`` (5 steps
    per epoch) until the signal reaches it; then send ``signum`` to the launcher (as Slurm
    and Kubernetes do) or to rank 1 alone (a lost process). (launcher's exit code, its
    console output, each rank's log)."""
    rank = 0 if to_launcher else 1
    command = [HELD_TRAIN if arg == "train.py" else arg for arg in command]
    env = dict(os.environ, HOLD_RANK=str(rank), HOLD_AT_STEP=str(at_step), HOLD_RELEASE="signal")
    job = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    held = held_pid(logs / f"workerlog.{rank}", job)
    if to_launcher:
        job.send_signal(signum)
    else:
        os.kill(held, signum)
    try:
        console = job.communicate(timeout=180)[0].decode()
    finally:
        job.kill()
    return job.returncode, console, [(logs / f"workerlog.{r}").read_text() for r in (0, 1)]


@once
def test_a_two_rank_job_killed_and_stopped_continues_with_the_same_command(
    two_ranks, fmnist_root, tmp_path
):
    """The same launcher command, --from-checkpoint auto, after rank 1 is SIGKILLed (the job
    ends) and after a SIGTERM to the launcher (both ranks stop after one common step, rank
    0 saves there, its stop line reaches the launcher's console, exit 15), at random
    steps: every rank takes the same checkpoint, and the job ends with the weights of the
    job never stopped, bit for bit. The rank a signal is for holds at its step until the
    signal arrives (``held_job``): a SIGTERM planned late in the run raced the run's end."""
    seed = random_seed()
    rng = random.Random(seed)
    kill_at, stop_at = sorted(rng.sample(range(1, 9), 2))
    why = f"seed {seed}: SIGKILL to rank 1 at step {kill_at}, SIGTERM at step {stop_at}"
    out = tmp_path / "job"

    args = train_args(
        fmnist_root, out, "--epochs", "2", "--print-interval", "1", "--from-checkpoint", "auto"
    )

    def command(logs):
        launcher = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2"]
        return [sys.executable, *launcher, "--log_dir", str(logs), *args]

    code, _, logs = held_job(
        command(tmp_path / "1"), tmp_path / "1", signal.SIGKILL, kill_at, False
    )
    assert code != 0 and "error: rank 0: rank 1 stopped" in logs[0], (why, logs[0][-2000:])
    saved = ckpt.saved_checkpoints(str(out / "resnet18"))
    code, console, logs = held_job(
        command(tmp_path / "2"), tmp_path / "2", signal.SIGTERM, stop_at, True
    )
    assert code == 15, (why, console[-3000:])
    expected = f"--from-checkpoint auto: {saved[-1][1]}, the newest" if saved else "no checkpoint"
    assert expected in logs[0], (why, logs[0][-3000:])
    stops = []
    for log in logs:
        assert "Traceback" not in log and "Termination signal" not in log, (why, log[-3000:])
        line = [line for line in log.splitlines() if "stopped by SIGTERM in epoch " in line]
        assert len(line) == 1, (why, log[-3000:], console[-3000:])
        stops.append(line[0].split("stopped by SIGTERM in epoch ")[1].split(":")[0])
    assert stops[0] == stops[1], (why, stops)  # "E after step K of 5" on both ranks
    stop_line = [line for line in console.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(stop_line) == 1, (why, console[-3000:])
    resume = ["python", "-m", "paddle.distributed.launch", "--nproc_per_node", "2", *args]
    assert stop_line[0].endswith(f"resume with: {shlex.join(resume)}"), (why, stop_line)
    final = subprocess.run(
        command(tmp_path / "3"), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    ok(final)
    assert_same_state(weights(out, 2), weights(two_ranks, 2))


@once
def test_sigint_to_one_rank_stops_every_rank_at_the_same_step(fmnist_root, tmp_path):
    """A signal that reached one rank only (a user's kill, a node's own agent): the ranks
    agree after the next step, rank 0 saves, and every rank exits with its line."""
    code, texts, stops = signalled_job(
        fmnist_root, tmp_path, signal.SIGINT, False, "--epochs", "50"
    )
    assert code != 0
    assert stops[0][:2] == stops[1][:2], stops
    saved = stops[0][2].split("resume with: ")[1].split()[-1]
    meta, _ = ckpt.read_checkpoint(saved)
    assert meta["global_step"] == (stops[0][0] - 1) * 5 + stops[0][1]


ETCD3_SITE = os.path.join(ROOT, ".etcd3-site")  # scripts/setup_etcd.sh


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """A private etcd server on free ports (scripts/setup_etcd.sh installs it); yields the
    launcher's --master value."""
    if shutil.which("etcd") is None or not os.path.isdir(ETCD3_SITE):
        pytest.skip("no etcd server or etcd3 client: scripts/setup_etcd.sh installs them")
    client, peer = free_port(), free_port()
    data = tmp_path_factory.mktemp("etcd")
    local = lambda port: f"http://127.0.0.1:{port}"  # noqa: E731
    server = subprocess.Popen(
        ["etcd", "--data-dir", str(data / "data"), "--listen-client-urls", local(client)]
        + ["--advertise-client-urls", local(client), "--listen-peer-urls", local(peer)]
        + ["--initial-advertise-peer-urls", local(peer)]
        + ["--initial-cluster", f"default={local(peer)}"],
        stdout=open(data / "etcd.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 30
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{local(client)}/health", timeout=1) as answer:
                    if json.load(answer).get("health") == "true":
                        break
            assert time.time() < deadline, (data / "etcd.log").read_text()[-2000:]
            time.sleep(0.2)
        yield f"etcd://127.0.0.1:{client}"
    finally:
        server.terminate()
        server.wait(10)


@once
def test_the_elastic_launcher_relaunches_a_killed_rank_and_the_run_continues(
    two_ranks, fmnist_root, tmp_path, etcd
):
    """Paddle's own restarts: only in its elastic mode (an etcd --master, --elastic_level 1)
    does the launcher relaunch ranks; after rank 1 is SIGKILLed it stops rank 0 and starts
    both again with the same command line, which, with --from-checkpoint auto, continues
    from the newest checkpoint and ends with the weights of the job never stopped."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    elastic = ["--master", etcd, "--job_id", "relaunch", "--nnodes", "1"]
    elastic += ["--elastic_level", "1", "--max_restart", "1", "--log_dir", str(logs)]
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2"]
    command += elastic + train_args(fmnist_root, out, "--epochs", "2", "--from-checkpoint", "auto")
    # etcd3 and its protobuf setting for the launcher (the ranks ignore both)
    env = dict(os.environ, PYTHONPATH=ETCD3_SITE, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    job = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for_epoch_1(out, job)
        os.kill(rank_1_pid(out), signal.SIGKILL)
        output = job.communicate(timeout=300)[0]
    finally:
        job.kill()
    assert job.returncode == 0, output[-3000:]
    rank0 = (logs / "workerlog.0").read_text()
    assert rank0.count("--from-checkpoint auto: ") == 2, rank0[-3000:]  # two starts
    assert f"--from-checkpoint auto: {out}/resnet18/" in rank0
    assert_same_state(weights(out, 2), weights(two_ranks, 2))
