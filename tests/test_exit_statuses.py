"""The exit-status contract (``core/errors.EXIT_STATUSES``, printed in docs/guide.md) with
real processes, row by row: a missing image root is 2, an external error of the executor
75, a signal outside the training steps 128 + N (a rank of a multi-rank job: 75), a file
system that cannot lock 2 naming it; real OSErrors are told apart. (A killed or stuck
peer: tests/test_data_parallel.py; a stop at a step: tests/test_stopping.py; what
schedulers do with each: tests/test_slurm.py, tests/test_cluster_manifests.py.)"""

import errno
import os
import signal
import sys

import pytest

from conftest import FAST_TRAIN, once, run_command, train_command
from paddle_resnet.commands import train
from paddle_resnet.core import atomic, errors

# train.py with a device fault planted (PADDLE_RESNET_FAULT=external-error@N)
DEVICE_FAULT = "tests/ranks/device_fault.py"

# Statuses, signals and locks do not depend on the Paddle version.
pytestmark = once


def last_line(text):
    return text.strip().splitlines()[-1]


def test_a_missing_image_root_is_2(tmp_path):
    result = run_command(
        [sys.executable, "train.py", *FAST_TRAIN, "--image-root", str(tmp_path / "nowhere")]
        + ["--output-dir", str(tmp_path / "out")]
    )
    assert result.returncode == errors.USER_ERROR, result.stderr[-3000:]
    assert last_line(result.stderr) == (
        f"error: image root '{tmp_path}/nowhere' does not exist or is not a folder"
    )
    assert "Traceback" not in result.stderr


def test_an_external_error_of_the_executor_is_75_in_one_line(fmnist_root, tmp_path):
    """What Paddle raises when a CUDA, cuDNN or NCCL call fails (an OSError without errno,
    planted at the third step by the tests' driver, tests/ranks/device_fault.py, which
    says so first): a crash a restart may fix, not the user's error."""
    command = train_command(fmnist_root, tmp_path / "out")
    command[command.index("train.py")] = DEVICE_FAULT
    result = run_command(command, PADDLE_RESNET_FAULT="external-error@3")
    assert result.returncode == errors.RESTARTABLE, result.stderr[-3000:]
    assert result.stdout.splitlines()[0] == (
        "fault injection (tests/ranks/device_fault.py, PADDLE_RESNET_FAULT=external-error@3): "
        "training step 3 of this process raises OSError"
    )
    assert "epoch 1 step 2:" in result.stdout and "epoch 1 step 3:" not in result.stdout
    assert last_line(result.stderr) == (
        "error: a CUDA, cuDNN or NCCL call failed (Paddle's ExternalError: CUDA error(719), "
        "unspecified launch failure. [Hint: 'cudaErrorLaunchFailure'. An exception occurred "
        "on the device while executing a kernel.] (injected at step 3 by PADDLE_RESNET_FAULT)): "
        "a restart may succeed; the checkpoints written are intact"
    )
    assert "Traceback" not in result.stderr


STOPPED_OUTSIDE_THE_STEPS = (
    "import os, signal, time\n"
    "from paddle_resnet.core.errors import exit_status\n"
    "from paddle_resnet.training import lifecycle\n"
    "def start_up():\n"
    "    with lifecycle.stops_reported():\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "        time.sleep(30)\n"
    "raise SystemExit(exit_status(start_up))\n"
)


@pytest.mark.parametrize("launched", [False, True], ids=["one process", "a rank of two"])
def test_a_signal_outside_the_training_steps_is_one_line(launched):
    """A SIGTERM before the steps (during start-up): a process stopped, nothing to save,
    143; a rank of a multi-rank job, whom the launcher stops when another rank ended: 75,
    since the job's status is the first rank's that ended (the launcher's rank order)."""
    env = {"PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6170,127.0.0.1:6171"} if launched else {}
    if launched:
        env["PADDLE_TRAINER_ID"] = "1"
    result = run_command([sys.executable, "-c", STOPPED_OUTSIDE_THE_STEPS], **env)
    expected = (
        (
            errors.RESTARTABLE,
            "error: rank 1: stopped by the launcher (SIGTERM) outside the training steps: "
            "another rank ended first (its log in the launcher's --log_dir says why), or the "
            "launcher was stopped",
        )
        if launched
        else (
            errors.stopped_status(signal.SIGTERM),
            "stopped by SIGTERM outside the training steps: nothing new to save; the same "
            "command continues",
        )
    )
    assert (result.returncode, result.stderr.strip()) == expected


def test_a_file_system_that_cannot_lock_is_named(fmnist_root, tmp_path, monkeypatch, capsys):
    """flock on Lustre mounted without flock, or NFS without its lock manager: the run
    ends at its first lock naming the file system (from /proc/mounts) and what to do."""

    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(atomic.fcntl, "flock", no_locks)
    out = tmp_path / "out"
    status = train.main([*FAST_TRAIN, "--image-root", fmnist_root, "--output-dir", str(out)])
    point, kind, options = atomic.mount_of(str(out))
    assert status == errors.USER_ERROR
    assert last_line(capsys.readouterr().err) == (
        f"error: {out}/{atomic.RUN_LOCK}: the file system ({kind} at {point}, mounted "
        f"{options}) cannot take a lock (flock: No locks available), which a run holds on "
        "its folders: mount it with locks (Lustre: -o flock; NFS: without nolock, with its "
        "lock manager running) or choose a folder on a file system that takes them"
    )


def os_error(action):
    try:
        action()
    except OSError as err:
        return err
    raise AssertionError("no OSError")


def test_os_errors_are_told_apart(tmp_path):
    """Real OSErrors: the user's (a missing file, a full disk, a read-only folder) are 2,
    a fault of the system (an I/O error of a shared volume, Paddle's external error) 75."""
    missing = os_error(lambda: open(tmp_path / "missing.pdparams", "rb"))
    assert errors.describe(missing) == (
        errors.USER_ERROR,
        f"error: {tmp_path}/missing.pdparams: No such file or directory",
    )
    with open("/dev/full", "wb", buffering=0) as full:  # every write: ENOSPC
        disk_full = os_error(lambda: full.write(b"checkpoint"))
    status, line = errors.describe(disk_full)
    assert status == errors.USER_ERROR and line.endswith(
        "No space left on device: free space or raise the quota (--keep-checkpoints N keeps fewer)"
    )
    read_only = OSError(errno.EROFS, os.strerror(errno.EROFS), "/checkpoints/rn50")
    assert errors.describe(read_only)[0] == errors.USER_ERROR
    for number in (errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.ENOTCONN):
        fault = OSError(number, os.strerror(number), "/checkpoints/rn50/resnet50/7/model.pdopt")
        assert errors.describe(fault) == (
            errors.RESTARTABLE,
            f"error: /checkpoints/rn50/resnet50/7/model.pdopt: {os.strerror(number)} (an I/O "
            "error of the file system: a restart may succeed)",
        )
    external = OSError("(External) NCCL error(2), unhandled system error. (at /paddle/x.cc:9)")
    assert errors.describe(external) == (
        errors.RESTARTABLE,
        "error: a CUDA, cuDNN or NCCL call failed (Paddle's ExternalError: NCCL error(2), "
        "unhandled system error.): a restart may succeed; the checkpoints written are intact",
    )
    assert errors.describe(MemoryError())[0] == errors.RESTARTABLE
