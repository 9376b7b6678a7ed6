"""The Slurm batch scripts (scripts/cluster/slurm) under a real Slurm started on this host
(tests/slurm_cluster.py), acting on the exit statuses (docs/guide.md): a training killed
after a checkpoint (a crash) is requeued by the script, a job requeued in the middle of an
epoch saves at its step, and each start resumes through --from-checkpoint auto: the job
ends COMPLETED with the weights of a run never stopped; a training that crashes at once
on every start ends FAILED after three starts without a checkpoint, in one line; the time
limit's warning (USR1 to the batch shell) stops the launchers of the multi-node script at
a step and the script requeues its job; a training that exits 2 (input no restart can
fix) ends the job FAILED, not requeued."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import slurm_cluster

from conftest import (
    FAST_TRAIN,
    HELD_TRAIN,
    ROOT,
    assert_same_state,
    once,
    train_command,
    training_into,
)
from paddle_resnet.core.errors import RESTARTABLE
from paddle_resnet.training import checkpoint as ckpt

# Signals, requeues and shell scripts do not depend on the Paddle version.
pytestmark = once

SCRIPTS = os.path.join(ROOT, "scripts", "cluster", "slurm")
SINGLE = os.path.join(SCRIPTS, "train.sbatch")
MULTI = os.path.join(SCRIPTS, "train_multinode.sbatch")
COMMON = os.path.join(SCRIPTS, "common.sh")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        with slurm_cluster.running(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster
    except slurm_cluster.Unavailable as reason:
        pytest.skip(f"no Slurm to test with: {reason}")


def submit(slurm, script, log, *args, options=(), **env):
    """Submit ``script args`` from the repository's root with this Python, one training
    process per node; its output is appended to ``log`` across restarts."""
    environment = {"PYTHON": sys.executable, "NPROC_PER_NODE": "1", **env}
    options = ["--chdir", ROOT, "--output", str(log), "--job-name", "pytest", *options]
    return slurm.sbatch(script, *args, options=options, env=environment)


def read(path):
    return path.read_text() if path.exists() else ""


def wait_for_text(slurm, job, log, text, timeout=180, after=""):
    """Poll the job's log until it holds ``text`` (after the first ``after``, a line that
    starts a part of it); fail at once should the job end."""
    deadline = time.monotonic() + timeout
    while text not in (read(log).partition(after)[2] if after else read(log)):
        state = slurm.state(job)
        assert state not in ENDED and time.monotonic() < deadline, (
            f"job {job} {state} without {text!r} in its log:\n{read(log)[-3000:]}\n{slurm.log()}"
        )
        time.sleep(0.2)


def wait_requeued(slurm, job, log, restarts, timeout=180):
    """Until the job waits PENDING for its begin time after its ``restarts``-th requeue
    (Slurm delays a requeued job: ``Slurm.start_now``); its fields."""
    deadline = time.monotonic() + timeout
    while True:
        fields = slurm.job(job)
        state = (fields["JobState"], fields["Restarts"], fields["Reason"])
        if state == ("PENDING", str(restarts), "BeginTime"):
            return fields
        assert fields["JobState"] not in ENDED and time.monotonic() < deadline, (
            f"job {job} {fields['JobState']}, not requeued {restarts} time(s):\n"
            f"{read(log)[-3000:]}\n{slurm.log()}"
        )
        time.sleep(0.2)


def training_pid(out):
    """The process id of the training (one process, no launcher) writing into ``out``."""
    pids = training_into(out)
    assert len(pids) == 1, pids
    return pids[0]


def test_the_batch_scripts_parse_and_pass_shellcheck():
    for script in (SINGLE, MULTI, COMMON):
        result = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        if shutil.which("shellcheck"):
            result = subprocess.run(
                ["shellcheck", "-x", script], cwd=ROOT, capture_output=True, text=True
            )
            assert result.returncode == 0, result.stdout
        if script == COMMON:
            continue
        text = open(script).read()
        for directive in ("--requeue", "--open-mode=append", "--signal=B:USR1@"):
            assert f"#SBATCH {directive}" in text, (script, directive)
        assert "--from-checkpoint auto" in text


def test_a_job_whose_training_exits_2_fails_and_is_not_requeued(slurm, tmp_path):
    """A user error (exit 2) would fail the same way on every restart: the job ends
    FAILED with exit code 2, never requeued."""
    log = tmp_path / "job.log"
    flags = [*FAST_TRAIN, "--image-root", "/nonexistent", "--output-dir", str(tmp_path / "out")]
    job = submit(slurm, SINGLE, log, *flags)
    fields = slurm.wait_state(job, ENDED, timeout=120)
    assert fields["JobState"] == "FAILED", (fields, read(log))
    assert fields["ExitCode"] == "2:0" and fields["Restarts"] == "0"
    output = read(log)
    assert "error: image root '/nonexistent' does not exist" in output
    assert output.strip().splitlines()[-1] == (
        "train.sbatch: training failed with exit status 2 (input that no restart can fix): "
        "not requeued"
    )


def test_a_crashed_and_a_requeued_job_continue_and_end_as_a_run_never_stopped(
    slurm, fmnist_root, tmp_path, uninterrupted
):
    """Start 1: the training is SIGKILLed (the OOM killer) in epoch 2, after writing epoch
    1's checkpoint: a crash after progress, which the script requeues. Start 2 resumes
    from epoch 1; scontrol requeue in the middle of epoch 2: the training saves at the
    step in flight and exits 143, and Slurm requeues the job. Start 3 resumes from that
    step through --from-checkpoint auto, and the job ends COMPLETED with the final weights
    of a run never stopped, bit for bit. (Each requeued start is let go at once.) Starts 1
    and 2 hold after epoch 2's second step until a signal reaches them
    (tests/ranks/held_train.py): on a fast CPU a run could finish before the signal."""
    out, log = tmp_path / "out", tmp_path / "job.log"
    held = dict(TRAIN_SCRIPT=HELD_TRAIN, HOLD_AT_STEP="12", HOLD_RELEASE="signal")
    job = submit(
        slurm, SINGLE, log, *train_command(fmnist_root, out)[3:], HOLD_STARTS="0,1", **held
    )
    wait_for_text(slurm, job, log, "held at global step 12")
    os.kill(training_pid(out), signal.SIGKILL)
    wait_requeued(slurm, job, log, 1)
    assert (
        f"train.sbatch: training crashed with exit status 137 after writing checkpoint 1: "
        f"requeueing job {job}"
    ) in read(log)

    slurm.start_now(job)
    second = f"train.sbatch: job {job} start 2 (SLURM_RESTART_COUNT=1)"
    wait_for_text(slurm, job, log, "held at global step 12", after=second)
    restart = read(log).partition(second)[2]
    assert f"resumed from {out}/resnet18/1 after epoch 1" in restart
    slurm.requeue(job)
    wait_requeued(slurm, job, log, 2)
    stop = re.search(
        r"^stopped by SIGTERM in epoch 2 after step (\d+) of 10: saved (\S+);", read(log), re.M
    )
    assert stop, read(log)[-3000:]
    steps, saved = int(stop.group(1)), stop.group(2)
    assert saved == str(out / "resnet18" / f"2-step{steps}") and steps == 2
    assert "train.sbatch: stopped by a signal (exit 143)" in read(log)
    meta, _ = ckpt.read_checkpoint(saved)
    assert (meta["epoch"], meta["step_in_epoch"]) == (1, steps)

    slurm.start_now(job)
    fields = slurm.wait_state(job, ENDED, timeout=180)
    output = read(log)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, output)
    assert fields["Restarts"] == "2"
    restart = output.partition(f"train.sbatch: job {job} start 3 (SLURM_RESTART_COUNT=2)")[2]
    assert f"resumed from {saved} after epoch 1, step {steps} of epoch 2" in restart
    assert restart.strip().splitlines()[-1] == "train.sbatch: training finished"
    assert not (out / f".slurm-crashes-{job}").exists()
    assert_same_state(ckpt.read_checkpoint(str(out / "resnet18" / "2"))[1], uninterrupted)


def test_a_crash_without_progress_ends_failed_after_three_starts(slurm, fmnist_root, tmp_path):
    """The multi-node script (one node, srun, one launcher with one rank) whose training
    fails at its second step on every start (an external error of the executor, exit
    75): requeued twice, then FAILED with that status and one line, not requeued again."""
    out, log, ranks = tmp_path / "out", tmp_path / "job.log", tmp_path / "ranks"
    args = train_command(fmnist_root, out)[3:]
    env = {
        "PADDLE_RESNET_FAULT": "external-error@2",
        "TRAIN_SCRIPT": "tests/ranks/device_fault.py",  # train.py with the fault planted
        "LAUNCH_LOG_DIR": str(ranks),
    }
    job = submit(slurm, MULTI, log, *args, options=["--nodes=1"], **env)
    for restarts in (1, 2):
        wait_requeued(slurm, job, log, restarts)
        assert (
            f"train_multinode.sbatch: training crashed with exit status {RESTARTABLE} without "
            f"a new checkpoint that verifies, {restarts} start(s) in a row: requeueing job {job}"
        ) in read(log)
        slurm.start_now(job)
    fields = slurm.wait_state(job, ENDED, timeout=180)
    output = read(log)
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "2", (fields, output)
    assert fields["ExitCode"] == f"{RESTARTABLE}:0"
    assert output.strip().splitlines()[-1] == (
        f"train_multinode.sbatch: training failed with exit status {RESTARTABLE} without a "
        "new checkpoint that verifies, 3 start(s) in a row: not requeued "
        "(MAX_CRASHES_WITHOUT_PROGRESS=3); the lines above say why"
    )
    rank0 = read(ranks / "node0" / "workerlog.0")
    assert rank0.count("error: a CUDA, cuDNN or NCCL call failed") == 3, rank0[-3000:]


def test_the_warning_before_the_time_limit_stops_the_launchers_and_requeues(
    slurm, fmnist_root, tmp_path
):
    """The multi-node script on one node (srun, one launcher with one rank): USR1 to the
    batch shell, as --signal=B:USR1@300 sends it, reaches the launcher as SIGTERM, the
    rank saves at its step, and the script requeues its job itself and exits 0. The rank
    holds after its third step until the signal reaches it (tests/ranks/held_train.py):
    on a fast CPU the run had finished before the signal went through Slurm."""
    out, log, ranks = tmp_path / "out", tmp_path / "job.log", tmp_path / "ranks"
    args = train_command(fmnist_root, out)[3:]
    held = dict(TRAIN_SCRIPT=HELD_TRAIN, HOLD_AT_STEP="3", HOLD_RELEASE="signal")
    job = submit(slurm, MULTI, log, *args, options=["--nodes=1"], LAUNCH_LOG_DIR=str(ranks), **held)
    wait_for_text(slurm, job, log, "held at global step 3")
    slurm.signal_batch(job, "USR1")
    fields = slurm.wait_state(job, {"PENDING"} | ENDED, timeout=60)
    output = read(log)
    assert fields["JobState"] == "PENDING" and fields["Restarts"] == "1", (fields, output)
    assert "train_multinode.sbatch: got SIGUSR1" in output
    assert f"stopped by the warning (exit 15): requeueing job {job}" in output
    # the launcher's own account of its arguments: one node, rank 0, the first node's
    # address and the job's port
    port = 20000 + int(job) % 10000
    for line in ("nnodes: 1", "rank: 0", rf"master: [\d.]+:{port}", "nproc_per_node: 1"):
        assert re.search(rf"LAUNCH INFO .* {line}$", output, re.M), line
    # the launcher's dumps of each rank's environment lie in a folder of the owner's alone
    assert list((ranks / "node0").glob("backup_env.*.json"))
    assert os.stat(ranks).st_mode & 0o777 == 0o700
    rank0 = read(ranks / "node0" / "workerlog.0")  # a folder per node
    stop = re.search(
        r"^stopped by SIGTERM in epoch (\d) after step (\d+) of 10: saved (\S+);", rank0, re.M
    )
    assert stop, rank0[-3000:]
    epoch, steps = int(stop.group(1)), int(stop.group(2))
    meta, _ = ckpt.read_checkpoint(stop.group(3))  # after step 10: the epoch's checkpoint
    assert (meta["epoch"], meta["step_in_epoch"]) == (
        (epoch - 1, steps) if steps < 10 else (epoch, 0)
    )
    slurm.run("scancel", job)
    assert slurm.wait_state(job, ENDED, timeout=60)["JobState"] == "CANCELLED"
