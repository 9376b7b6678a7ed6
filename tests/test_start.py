"""The start of a multi-rank job (everything before the first step), with real ranks of
``paddle.distributed.launch``: a rank that refuses ends every rank with its status, each
rank in one line; a rank stuck in C code holding the GIL still ends at the start's
deadline, and with its launcher (``core/rank_guard.py``: a watcher process, not a thread).
Faults of one rank are planted by tests/ranks/start_fault.py."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT, launch, once, train_args, training_into
from paddle_resnet.core import bootstrap
from paddle_resnet.core.errors import RESTARTABLE, USER_ERROR, UserError, describe
from paddle_resnet.training import lifecycle, rendezvous

pytestmark = pytest.mark.cpu_only
FAULTY = "tests/ranks/start_fault.py"


def rank_logs(logs):
    return [(logs / f"workerlog.{rank}").read_text() for rank in (0, 1)]


def children_of(launcher):
    """The processes ``launcher`` started (its ranks)."""
    found = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True)
    return found.stdout.split()


def assert_no_rank_left(out, script=FAULTY):
    deadline = time.time() + 10
    while training_into(out, script) and time.time() < deadline:
        time.sleep(0.2)
    left = training_into(out, script)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "ranks outlived their job"


def faulty_args(fmnist_root, out, *flags):
    args = train_args(fmnist_root, out, "--epochs", "1", *flags)
    args[0] = FAULTY
    return args


def test_a_refusal_on_rank_1_ends_every_rank_with_its_status(fmnist_root, tmp_path):
    """Rank 1 refuses after rank 0 ran its programs (which made the rings): rank 0, waiting
    for it before the first step, ends with status 2 and says why; the launcher reports
    rank 0's status first, where it used to report 75 (or kill rank 0 stuck in a
    collective) and hide the refusal."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    result = launch(faulty_args(fmnist_root, out), logs, env={"START_FAULT": "refuse:weights:1"})
    rank0, rank1 = rank_logs(logs)
    assert result.returncode == USER_ERROR, result.stdout[-3000:]
    refusal = "a refusal of rank 1 in phase weights (the test's fault)"
    assert f"error: {refusal}" in rank1
    assert f"error: rank 0: rank 1 ended the start ({refusal}): this rank ends too" in rank0
    assert "Traceback" not in rank0 + rank1 + result.stdout
    assert_no_rank_left(out)


def test_every_checkpoint_damaged_ends_both_ranks_in_one_line_each(fmnist_root, tmp_path):
    """--from-checkpoint auto: rank 0 chooses, finds every checkpoint damaged and refuses;
    rank 1, waiting for its choice in the job's store (no collective op), ends too."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    damaged = out / "resnet18" / "1"
    damaged.mkdir(parents=True)
    (damaged / "model.pdparams").write_bytes(b"junk")  # not the bytes meta.json lists
    entry = {"bytes": 4, "sha256": "0" * 64}
    (damaged / "meta.json").write_text(json.dumps({"epoch": 1, "files": {"model.pdparams": entry}}))
    args = train_args(fmnist_root, out, "--epochs", "1", "--from-checkpoint", "auto")
    result = launch(args, logs)
    rank0, rank1 = rank_logs(logs)
    assert result.returncode == USER_ERROR, result.stdout[-3000:]
    refusal = rank0.strip().splitlines()[-1]
    assert refusal.startswith("error: --from-checkpoint auto: every checkpoint in"), rank0
    ended = f"error: rank 1: rank 0 ended the start ({refusal.removeprefix('error: ')})"
    assert ended in rank1, rank1[-2000:]
    assert "Traceback" not in rank0 + rank1
    assert_no_rank_left(out, "train.py")
    assert_no_rank_left(out)


@once  # the watcher (core/rank_guard.py) is plain Python, run without Paddle
def test_a_rank_blocked_holding_the_gil_ends_at_the_start_deadline(fmnist_root, tmp_path):
    """A stuck rank (planted: C code holding the GIL, where no thread of it runs) is ended
    by its watcher process at --start-timeout with one line naming its phase; the job
    ends as a crash a restart may fix."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    began = time.time()
    result = launch(
        faulty_args(fmnist_root, out, "--start-timeout", "15"),
        logs,
        env={"START_FAULT": "block:data:1"},
    )
    seconds = time.time() - began
    rank0, rank1 = rank_logs(logs)
    assert "rank 1: blocking in C with the GIL held" in rank1
    assert (
        "error: rank 1: the start passed its deadline (--start-timeout 15 s) in phase 'data'"
        in rank1
    ), rank1[-2000:]
    # a crash a restart may fix: rank 0, waiting for rank 1, passed the deadline too (247:
    # the launcher's status for a rank it found killed) or was stopped by the launcher (75)
    assert result.returncode in (RESTARTABLE, 247), result.stdout[-3000:]
    assert "Traceback" not in rank0 + rank1
    assert seconds < 15 + 45
    assert_no_rank_left(out)


@once  # the watcher (core/rank_guard.py) is plain Python, run without Paddle
def test_the_ranks_end_with_their_launcher_while_blocked_holding_the_gil(fmnist_root, tmp_path):
    """SIGKILL to the launcher while rank 1 is stuck holding the GIL (no deadline): its
    watcher ends it within seconds, where a thread of the rank could never run."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2"]
    command += ["--log_dir", str(logs), *faulty_args(fmnist_root, out, "--start-timeout", "0")]
    job = subprocess.Popen(
        command,
        cwd=ROOT,
        env=dict(os.environ, START_FAULT="block:data:1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    rank1 = logs / "workerlog.1"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and job.poll() is None:
            if rank1.exists() and "blocking in C with the GIL held" in rank1.read_text():
                break
            time.sleep(0.2)
        assert len(children_of(job.pid)) == 2
    finally:
        job.kill()
        job.wait()
    assert_no_rank_left(out)
    gone = f"error: rank 1: its launcher (pid {job.pid}) is gone: this rank ends too"
    assert gone in rank1.read_text()


# any class is published alike (plain Python): one of them on both Paddle versions
@pytest.mark.parametrize("exception", [pytest.param("ValueError", marks=once), "RuntimeError"])
def test_an_unexpected_exception_on_rank_1_ends_every_rank_at_once(
    fmnist_root, tmp_path, exception
):
    """A plain exception (a bug, no error the toolkit knows) ends rank 1's start: every
    rank ends within seconds, each with one line naming rank 1 and the exception's class,
    where rank 0 used to wait for the deadline (or be stopped by the launcher without a
    word of why); the job's status is a crash the scheduler may retry."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    began = time.time()
    result = launch(
        faulty_args(fmnist_root, out, "--start-timeout", "120"),
        logs,
        env={"START_FAULT": f"{exception}:data:1"},
    )
    seconds = time.time() - began
    rank0, rank1 = rank_logs(logs)
    fault = f"{exception}: a {exception} of rank 1 in phase data (the test's fault)"
    assert f"error: rank 1: the start ended by an unexpected {fault}" in rank1, rank1[-2000:]
    ended = f"error: rank 0: rank 1 ended the start (an unexpected {fault}"
    assert ended in rank0, rank0[-2000:]
    assert "Traceback" not in rank0
    assert result.returncode == RESTARTABLE, result.stdout[-3000:]
    assert seconds < 100, "the ranks waited for the start's deadline"
    assert_no_rank_left(out)


@once  # the watcher (core/rank_guard.py) is plain Python, run without Paddle
def test_no_watcher_without_the_launcher(fmnist_root, tmp_path):
    """``python train.py`` whose environment has PADDLE_LOG_DIR (exported by a user, or left
    from a launched shell) but no launcher: no watcher process, hence no start deadline
    and no SIGKILL of its process group at exit."""
    out = tmp_path / "job"
    result = subprocess.run(
        [sys.executable, *faulty_args(fmnist_root, out, "--start-timeout", "600")],
        cwd=ROOT,
        env=dict(os.environ, PADDLE_LOG_DIR=str(tmp_path / "logs"), START_FAULT="watchers:data:0"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "rank 0: watcher processes: " in result.stdout, result.stderr[-3000:]
    assert "rank 0: watcher processes: 0" in result.stdout
    assert result.returncode == USER_ERROR, result.stderr[-3000:]


@once  # the watcher (core/rank_guard.py) is plain Python, run without Paddle
def test_a_finished_run_stuck_in_teardown_ends_with_status_0(fmnist_root, tmp_path):
    """Rank 1's run finishes, then its teardown is stuck (planted: C code holding the GIL,
    for ever): at PADDLE_RESNET_TEARDOWN_SECONDS after its run ended the rank ends with its
    run's status, 0, and the job is done, where the watcher's SIGKILL used to make it a
    crash (247) that a scheduler requeues."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    result = launch(
        faulty_args(fmnist_root, out),
        logs,
        env={"START_FAULT": "hold-teardown:-:1", "PADDLE_RESNET_TEARDOWN_SECONDS": "3"},
    )
    rank0, rank1 = rank_logs(logs)
    assert "rank 1: blocking in C with the GIL held (teardown" in rank1, rank1[-2000:]
    assert result.returncode == 0, result.stdout[-3000:]
    held = "rank 1: its run had finished (status 0) and its teardown took 3 s: cut there"
    assert held in rank1, rank1[-2000:]
    assert "Traceback" not in rank0 + rank1
    assert_no_rank_left(out)


@once  # the names read from the store are checked in plain Python (rendezvous.py)
def test_a_shared_checkpoint_name_that_leaves_the_run_folder_is_refused(fmnist_root, tmp_path):
    """--from-checkpoint auto: rank 1 reads a choice that would name a folder outside the
    run's (planted in the store) and refuses it in one line naming the key; rank 0 ends
    with its status, 2."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    args = faulty_args(fmnist_root, out, "--from-checkpoint", "auto", "--start-timeout", "120")
    result = launch(args, logs, env={"START_FAULT": "shared-name:../../elsewhere:0"})
    rank0, rank1 = rank_logs(logs)
    refusal = (
        "rank 1: the job's key-value store holds '../../elsewhere' under "
        "'paddle_resnet/start/shared/from-checkpoint auto' (rank 0's choice): not the name "
        "of a checkpoint folder (<epochs> or <epoch>-step<steps>); refused, it would name a file"
    )
    assert f"error: {refusal}" in rank1, rank1[-2000:]
    assert f"error: rank 0: rank 1 ended the start ({refusal}): this rank ends too" in rank0
    assert result.returncode == USER_ERROR, result.stdout[-3000:]
    assert "Traceback" not in rank0 + rank1
    assert_no_rank_left(out)


class ScriptedStore:
    """A job's key-value store of two ranks whose counters read as scripted: ``arrives``
    maps a counter to how many of its reads return 1 before it reads 2 (the other rank
    comes later); it counts every request."""

    def __init__(self, arrives=None):
        self.arrives, self.values, self.requests = dict(arrives or {}), {}, 0

    def add(self, key, amount):
        self.requests += 1
        if key in self.arrives:
            self.arrives[key] -= 1
            return 2 if self.arrives[key] < 0 else 1
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]

    def set(self, key, value):
        self.requests += 1
        self.values[key] = value

    def get(self, key):
        self.requests += 1
        return self.values[key]


def test_the_start_polls_back_off():
    """A wait polls after 10 ms, then twice as long each time up to 1 s, with two requests
    per poll (its own counter, and whether a peer ended the start): a peer 20 polls late
    costs 42 requests over 14.3 s, where a fixed 50 ms pause asked 572 times."""
    pauses = []
    late = rendezvous.PREFIX + "/reached/programs"
    store = ScriptedStore({late: 21})  # agree's own add, then 20 polls that find one rank
    rendezvous.Rendezvous(store, rank=1, world_size=2, sleep=pauses.append).agree("programs")
    assert pauses == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64] + [1.0] * 13
    assert store.requests == 1 + 2 * len(pauses) + 1
    quick = ScriptedStore()  # a peer that is there already: no pause at all
    quick.values[rendezvous.PREFIX + "/reached/programs"] = 1
    rendezvous.Rendezvous(quick, rank=1, world_size=2, sleep=pauses.append).agree("programs")
    assert len(pauses) == 20 and quick.requests == 2


def test_the_launchers_stop_while_rank_0_waits_to_be_read_keeps_its_refusal():
    """Rank 0 refused its start and waits for rank 1 to read why; rank 1 reads it and
    exits, and the launcher's SIGTERM (a real one, to this process) reaches rank 0 in a
    pause of that wait, as it did in CI: rank 0 still ends with the refusal (status 2,
    which the launcher reports), where it ended as stopped by the launcher (75)."""
    store = ScriptedStore()
    environ = {name: "1" for name in bootstrap.LAUNCHER_VARIABLES}
    environ.update(PADDLE_TRAINER_ENDPOINTS="127.0.0.1:1,127.0.0.1:2", PADDLE_TRAINER_ID="0")

    def sleep(pause):  # rank 1 has read why and exited: the launcher stops rank 0
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Exception) as ended:
            with lifecycle.stops_reported(environ) as stops:
                meeting = stops.met(rendezvous.Rendezvous(store, 0, 2, sleep=sleep))
                with meeting.start():
                    raise UserError("every checkpoint is damaged")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert describe(ended.value) == (USER_ERROR, "error: every checkpoint is damaged")


@pytest.mark.parametrize(
    "name", ["../../elsewhere", "/etc", "..", "1/../..", "1\0", "17\n", "", "1-step", 17, ["1"]]
)
def test_a_checkpoint_name_from_the_store_that_is_no_name_is_refused(name):
    """Rank 1 reads rank 0's ``--from-checkpoint auto`` choice: anything but a checkpoint
    folder's name is refused in one line naming the key, before it names a path."""
    store = ScriptedStore()
    key = rendezvous.PREFIX + "/shared/from-checkpoint auto"
    store.values.update({key: json.dumps(name), key + "/ready": 1})
    meeting = rendezvous.Rendezvous(store, rank=1, world_size=2, sleep=lambda pause: None)
    with pytest.raises(UserError) as refused:
        meeting.share("from-checkpoint auto", check=rendezvous.checkpoint_name_problem)
    assert str(refused.value) == (
        f"rank 1: the job's key-value store holds {name!r} under '{key}' (rank 0's choice): "
        "not the name of a checkpoint folder (<epochs> or <epoch>-step<steps>); refused, it "
        "would name a file"
    )


@pytest.mark.parametrize("name", ["17", "2-step6", None])
def test_a_checkpoint_name_from_the_store_is_taken(name):
    store = ScriptedStore()
    key = rendezvous.PREFIX + "/shared/from-checkpoint auto"
    store.values.update({key: json.dumps(name), key + "/ready": 1})
    meeting = rendezvous.Rendezvous(store, rank=1, world_size=2, sleep=lambda pause: None)
    assert meeting.share("from-checkpoint auto", check=rendezvous.checkpoint_name_problem) == name


def test_a_roll_call_names_the_ranks_that_stopped(tmp_path, monkeypatch):
    """Rank 1 of 4 after a failed collective (a scripted store, a scripted clock): rank 0
    elsewhere answered, rank 2 elsewhere never does, rank 3 on this host is a process that
    has ended. Rank 3 is named at once from its process, rank 2 once the window is over
    (the answer came from nobody), rank 0 not at all, a rank that answered and has ended
    since not at all; a store that is gone names None (rank 0, its host, is). At 16 ranks
    on one host a 2-s window without the process check named 14 live ranks slow to
    notice; at 4 ranks the process check alone named a survivor that had answered and
    ended."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: no such process
    now = [0.0]
    store = ScriptedStore()
    prefix = rendezvous.PREFIX
    for peer, where in (
        (0, "elsewhere 11"),
        (2, "elsewhere 12"),
        (3, f"{socket.gethostname()} {gone.pid}"),
    ):
        store.values[f"{prefix}/where/{peer}"] = where.encode()
        store.values[f"{prefix}/where/{peer}/ready"] = 1
    store.values[f"{prefix}/roll-call/0"] = 1

    def sleep(seconds):
        now[0] += seconds

    meeting = rendezvous.Rendezvous(store, 1, 4, sleep=sleep, clock=lambda: now[0])
    assert meeting.roll_call(seconds=2.0) == [2, 3]
    assert 2.0 <= now[0] < 3.0  # the window for rank 2, no longer
    store.values[f"{prefix}/roll-call/2"] = 1  # rank 2 answers: only rank 3 is named
    now[0] = 0.0
    assert meeting.roll_call(seconds=2.0) == [3] and now[0] == 0.0
    # a survivor that answered and has ended since (its process gone) is not named
    store.values[f"{prefix}/roll-call/3"] = 1
    assert meeting.roll_call(seconds=2.0) == []

    class Gone(ScriptedStore):
        def add(self, key, amount):
            raise RuntimeError("(InvalidArgument) TCP send error. Details: Broken pipe.")

    assert rendezvous.Rendezvous(Gone(), 1, 4, sleep=sleep).roll_call() is None
    # a rank blocked until rank 0 exits finds the store gone: it reads what a survivor of
    # its host found (the verdict file in the launcher's log folder)
    monkeypatch.setenv("PADDLE_LOG_DIR", str(tmp_path))
    monkeypatch.setenv("PADDLE_MASTER", "127.0.0.1:6170")
    store.values[f"{prefix}/roll-call/3"] = 0
    assert meeting.roll_call(seconds=0.0) == [3]  # and leaves its verdict
    assert rendezvous.Rendezvous(Gone(), 2, 4, sleep=sleep).roll_call() == [3]
