"""A run's life as a process among processes: the signals that stop it and how each
stop is reported, the watcher beside each launched rank, the launcher's console, and the
peers watched during the steps.

Ctrl-C and SIGTERM during training (what Slurm, Kubernetes and preemptible clouds send
before SIGKILL): the step in flight finishes, a checkpoint is written at that step, one
line says how to resume, and ``Stopped`` is raised: the tool exits 130 or 143. With
several ranks the ranks sum who was asked after each step (``StepAgreement``), so all
stop at the same step; rank 0 saves and the others wait for it. The grace this needs is
one step plus the write (ResNet-50 on one A100: about 0.8 s; schedulers give 30 s).

Further SIGTERMs are the same request: ``paddle.distributed.launch`` passes a signal on
as up to three SIGTERMs 0.2 s apart, and Slurm signals every process of a job. (Python
runs a handler only when the main thread is back from Paddle's C++ code, up to a step
later, so its timing cannot tell a burst from a second request: under load a rank 1.3 s
into a step took the launcher's second SIGTERM for a new one.) A SIGINT more than
``REPEATS_SECONDS`` after the first is Ctrl-C pressed again: the process ends at once.
"""

import contextlib
import os
import shlex
import signal
import stat
import sys
import time

import numpy as np

from paddle_resnet.core import bootstrap, rank_guard, watchdog
from paddle_resnet.core.errors import ConfigError, RestartableError, stopped_status
from paddle_resnet.core.rank_guard import RankGuard

EXIT_CODES = {number: stopped_status(number) for number in (signal.SIGINT, signal.SIGTERM)}
REPEATS_SECONDS = 1.0


class Stopped(Exception):
    """A run stopped by a signal, saved and said: the tool exits with ``exit_code``."""

    def __init__(self, line, exit_code):
        super().__init__(line)
        self.exit_code = exit_code


class StepAgreement:
    """What every rank agrees on after each step, in one all-reduce: whether to stop (while
    entered, SIGINT and SIGTERM ask to stop after the step; a divergence on any rank),
    and whether a timed save is due (``clock``: rank 0's answer, ``run_folder.Saves``)."""

    def __init__(self, all_reduce=None, clock=None):
        self.all_reduce = all_reduce
        self.received = None  # this process's first signal
        self.first_sigint_at = None
        self.signal_number = None  # the signal the run stops for, the same on every rank
        self.clock = clock or (lambda: False)
        self.save_due = False  # the same on every rank
        self.diverged = 0  # how many ranks' last step diverged, the same on every rank
        self._previous = {}

    def __enter__(self):
        for number in EXIT_CODES:
            self._previous[number] = signal.signal(number, self._request)
        return self

    def __exit__(self, *exc_info):
        if self.signal_number is None:  # stopping: a later signal still ends it at once
            for number, handler in self._previous.items():
                signal.signal(number, handler)

    def _request(self, number, frame):
        now = time.monotonic()
        if self.received is None:
            self.received = number
        if number != signal.SIGINT:
            return
        if self.first_sigint_at is None:
            self.first_sigint_at = now
        elif now - self.first_sigint_at > REPEATS_SECONDS:
            for other in EXIT_CODES:
                signal.signal(other, signal.SIG_DFL)
            os.kill(os.getpid(), number)

    def should_stop(self, diverged=False):
        """After each step, on every rank: whether the run stops here; sets
        ``signal_number`` (most ranks'), ``diverged`` (how many ranks) and ``save_due``."""
        if self.all_reduce is None:
            self.signal_number = self.received
            self.save_due = self.clock()
            self.diverged = int(diverged)
        else:
            # [asked, sigint, sigterm, timed save, diverged]
            asked = [self.received is not None]
            asked += [self.received == number for number in EXIT_CODES]
            asked += [self.clock(), diverged]
            counts = self.all_reduce(np.array(asked, dtype=np.float64))
            if counts[0]:
                sigints, sigterms = counts[1:3]
                self.signal_number = signal.SIGINT if sigints > sigterms else signal.SIGTERM
            self.save_due = bool(counts[3])
            self.diverged = int(counts[4])
        return self.signal_number is not None or self.diverged > 0


def launcher_command(environ=os.environ):
    """``python -m paddle.distributed.launch`` with this job's counts, or ``python``."""
    local = environ.get("PADDLE_LOCAL_SIZE")
    if not local or int(environ.get("PADDLE_TRAINERS_NUM", "1")) <= 1:
        return ["python"]
    command = ["python", "-m", "paddle.distributed.launch"]
    nodes = environ.get("PADDLE_NNODES", "1")
    if nodes != "1":
        command += ["--nnodes", nodes]
        if environ.get("PADDLE_MASTER"):
            command += ["--master", environ["PADDLE_MASTER"]]
    return command + ["--nproc_per_node", local]


def resume_command(directory, argv=None, environ=os.environ):
    """This run's command line with ``--from-checkpoint directory``, or unchanged where
    it says ``--from-checkpoint auto``."""
    argv = list(sys.argv if argv is None else argv)
    if "--from-checkpoint=auto" in argv or ("--from-checkpoint", "auto") in zip(argv, argv[1:]):
        return shlex.join([*launcher_command(environ), *argv])
    kept, args = [], iter(argv[1:])
    for arg in args:
        if arg == "--from-checkpoint":
            next(args, None)  # its value
        elif not arg.startswith("--from-checkpoint="):
            kept.append(arg)
    return shlex.join([*launcher_command(environ), argv[0], *kept, "--from-checkpoint", directory])


def stopped(number, where, directory):
    """The one line of a stopped run, and its exit code."""
    name = signal.Signals(number).name
    line = f"stopped by {name} {where}: saved {directory}; resume with: {resume_command(directory)}"
    return line, EXIT_CODES[number]


class StoppedBySignal(Exception):
    """SIGTERM or SIGINT (``number``) outside the training steps."""

    def __init__(self, number):
        super().__init__(number)
        self.number = number


def _stopped(signum, frame):
    raise StoppedBySignal(signum)


class Stops:
    """What ``stops_reported`` knows of the run: its start's ``rendezvous`` once met."""

    rendezvous = None

    def met(self, rendezvous):
        self.rendezvous = rendezvous
        return rendezvous


@contextlib.contextmanager
def stops_reported(environ=os.environ):
    """SIGTERM or SIGINT outside the training steps end the run in one line (not a
    traceback and Paddle's C++ dump): for a launched rank, another rank ended
    (``RestartableError``, or that rank's own end during the start); a single process
    was stopped: status 128 + the signal."""
    launched = len([e for e in environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e]) > 1
    rank = environ.get("PADDLE_TRAINER_ID", "?")
    numbers = (signal.SIGTERM, signal.SIGINT)
    previous = {number: signal.signal(number, _stopped) for number in numbers}
    ended = True  # by an exception: an error, or a stop (SystemExit)
    stops = Stops()
    try:
        yield stops
        ended = False
    except StoppedBySignal as stop:
        name = signal.Signals(stop.number).name
        peer = stops.rendezvous.ended_by_peer() if stops.rendezvous else None
        if peer:
            raise peer from None
        if launched:
            raise RestartableError(
                f"rank {rank}: stopped by the launcher ({name}) outside the training steps: "
                "another rank ended first (its log in the launcher's --log_dir says why), "
                "or the launcher was stopped"
            ) from None
        print(
            f"stopped by {name} outside the training steps: nothing new to save; "
            "the same command continues",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(stopped_status(stop.number)) from None
    finally:
        # A launched rank that ends by an error or a stop keeps its status: the launcher's
        # SIGTERM, sent once another rank ended, must not kill it during Paddle's teardown
        # (the launcher then reported 241, a death by signal, instead of its 75 or 143).
        if ended and bootstrap.launched(environ):
            previous[signal.SIGTERM] = signal.SIG_IGN
        for number, handler in previous.items():
            signal.signal(number, handler)


class _Unguarded:
    """A process not started by the launcher: no watcher (Ctrl-C and the user decide)."""

    def phase(self, name):
        pass

    def started(self):
        pass


@contextlib.contextmanager
def guarded(start_timeout, environ=os.environ):
    """For a launched process, a watcher process (``core/rank_guard.py``) that ends it
    when the launcher dies (an orphan would hold the folder's lock) or its start outlasts
    ``start_timeout``; yields the ``RankGuard``. A process, not a thread: the main thread
    can block in Paddle's C++ holding the GIL (PR_SET_PDEATHSIG would fire on the death
    of the launcher's thread). The teardown has PADDLE_RESNET_TEARDOWN_SECONDS."""
    if not bootstrap.launched(environ):
        yield _Unguarded()
        return
    try:
        teardown = rank_guard.teardown_seconds(environ)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    guard = RankGuard(
        environ.get("PADDLE_TRAINER_ID", "?"), bootstrap.PARENT_AT_START, start_timeout, teardown
    )
    try:
        yield guard
        guard.finished()
    finally:
        guard.close()


def tell_launcher_console(line, environ=os.environ):
    """Also write ``line`` on the launcher's console: stopping, it closes the rank's log it
    echoes (the console showed only "Terminating with signal 15"). Not to a file the
    launcher writes at its own offset (``> file``): its next line would overwrite it."""
    if not bootstrap.launched(environ):
        return
    launcher = f"/proc/{os.getppid()}"
    console = os.path.join(launcher, "fd", "1")
    try:
        ours = os.fstat(sys.stdout.fileno())
        handles = sum(
            _same_file(os.stat(os.path.join(launcher, "fd", fd)), ours)
            for fd in os.listdir(os.path.join(launcher, "fd"))
        )
        target = os.stat(console)
        if handles >= 2 or _same_file(target, ours):
            return
        with open(os.path.join(launcher, "fdinfo", "1")) as info:
            fields = dict(entry.split(":", 1) for entry in info if ":" in entry)
        flags = int(fields["flags"], 8)
        if stat.S_ISREG(target.st_mode) and not flags & os.O_APPEND:
            return
        with open(console, "a") as out:
            out.write(line + "\n")
    except (OSError, ValueError, KeyError):  # another platform, or the launcher is gone
        return


def _same_file(a, b):
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def peers_watched(rank, world_size, checkpoints, timeout, roll_call=None):
    """Another rank's death (a failed all-reduce: "std::exception", or the launcher's
    SIGTERM), or its being stuck for ``timeout`` seconds, in one line naming it (the
    survivors' ``roll_call``)."""
    if world_size == 1:
        yield
        return
    others = [r for r in range(world_size) if r != rank]
    who = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {others}"
    resume = (
        f"The checkpoints in {checkpoints} are intact: resume with --from-checkpoint {checkpoints}"
    )

    def stuck(idle):
        return (
            f"rank {rank}: no progress for {idle:.0f} s (--collective-timeout {timeout}): "
            f"{who} is stuck (stopped, or hung) and this rank waits for it in a "
            f"collective operation. {resume}"
        )

    def gone():
        """Who stopped, by the roll call (the launcher's SIGTERMs ignored meanwhile: a
        Python handler would interrupt the store's socket calls)."""
        if roll_call is None:
            return who
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        silent = roll_call()
        if silent is None:
            return "rank 0 (the host of the job's key-value store, now gone)"
        if not silent:
            return who
        return f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}"

    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        with watchdog.watching(timeout, stuck):
            yield
    except StoppedBySignal:
        raise RestartableError(
            f"rank {rank}: {gone()} stopped (killed, or failed: see its log in the "
            f"launcher's --log_dir), and the launcher ended this rank (SIGTERM). "
            f"{resume}"
        ) from None
    except RuntimeError as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise RestartableError(
            f"rank {rank}: {gone()} stopped (killed, or failed: see its log in the "
            f"launcher's --log_dir); a collective operation failed ({reason}). "
            f"{resume}"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
