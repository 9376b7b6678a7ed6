"""Ctrl-C and SIGTERM during training (what Slurm, Kubernetes and preemptible clouds send
before SIGKILL): the step in flight finishes, a checkpoint is written at that step, one
line says what was saved and how to resume, and the training raises ``Stopped``: the
tool exits 130 (SIGINT) or 143 (SIGTERM). A second Ctrl-C ends the process at once (the default action: no traceback,
no Paddle dump); the checkpoints already written are complete, as ever.

With several ranks every rank stops after the same step: after each step the ranks sum
who was asked (``StopRequests.should_stop``, one small all-reduce), so a signal that
reached one rank, or reached them during different steps, stops them all at the next
common step; rank 0 saves and the others wait for its checkpoint before they exit.

Further SIGTERMs are the same request: ``paddle.distributed.launch`` passes a SIGINT or
SIGTERM on to each rank as up to three SIGTERMs 0.2 s apart, Slurm signals every process
of a job, and the sender follows with SIGKILL when its grace period is over. (Python
runs a handler only when the main thread is back from Paddle's C++ code, up to a step
later: the time a handler runs cannot tell a burst from a second request. Under load a
1-second window did not: a rank 1.3 s into a step took the launcher's second SIGTERM for
a new one and ended without saving.) A SIGINT more than ``REPEATS_SECONDS`` after the
first is a person pressing Ctrl-C again.

The grace period is one training step plus the checkpoint write (ResNet-50 on one
A100: about 0.3 s and 0.5 s; on 2 CPU cores at 224 px about 5 s and 1 s): schedulers
give 30 s (Kubernetes' default) or more, and the launcher itself waits 30 s before it
kills the ranks.
"""

import os
import shlex
import signal
import sys
import time

import numpy as np

from paddle_resnet.core.errors import stopped_status

EXIT_CODES = {number: stopped_status(number) for number in (signal.SIGINT, signal.SIGTERM)}
REPEATS_SECONDS = 1.0


class Stopped(Exception):
    """A run stopped by a signal, its checkpoint saved and its line printed: the library
    raises it, the tool that started the run exits with ``exit_code``."""

    def __init__(self, line, exit_code):
        super().__init__(line)
        self.exit_code = exit_code


class StopRequests:
    """While entered (main thread), SIGINT and SIGTERM ask the training to stop after its
    current step. ``all_reduce`` (``distributed.all_reduce_sum``) with several ranks.
    With ``save_every_seconds``, a save is due once that long has passed since the last
    (``saved``) by rank 0's clock: ``save_due`` after the step where the ranks learn it."""

    def __init__(self, all_reduce=None, save_every_seconds=0, rank=0):
        self.all_reduce = all_reduce
        self.received = None  # this process's first signal
        self.first_sigint_at = None
        self.signal_number = None  # the signal the run stops for, the same on every rank
        self.save_every_seconds = save_every_seconds
        self.rank = rank
        self.last_save = time.monotonic()
        self.save_due = False  # the same on every rank
        self.diverged = 0  # how many ranks' last step diverged, the same on every rank
        self._previous = {}

    def saved(self):
        """A checkpoint was written now: the next timed save is due a period later."""
        self.last_save = time.monotonic()
        self.save_due = False

    def clock_says_save(self):
        """Rank 0's view: a timed save is due."""
        return (
            self.rank == 0
            and self.save_every_seconds > 0
            and time.monotonic() - self.last_save >= self.save_every_seconds
        )

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
        """After each step, on every rank: whether the run stops here (some rank was
        asked, or its step ``diverged``: ``divergence.py``); then ``signal_number`` is the
        one most ranks received, and ``diverged`` how many ranks' step diverged. Also sets
        ``save_due`` (rank 0's clock; in the same all-reduce)."""
        if self.all_reduce is None:
            self.signal_number = self.received
            self.save_due = self.clock_says_save()
            self.diverged = int(diverged)
        else:
            # [asked, sigint, sigterm, timed save, diverged]
            asked = [self.received is not None]
            asked += [self.received == number for number in EXIT_CODES]
            asked += [self.clock_says_save(), diverged]
            counts = self.all_reduce(np.array(asked, dtype=np.float64))
            if counts[0]:
                sigints, sigterms = counts[1:3]
                self.signal_number = signal.SIGINT if sigints > sigterms else signal.SIGTERM
            self.save_due = bool(counts[3])
            self.diverged = int(counts[4])
        return self.signal_number is not None or self.diverged > 0


def launcher_command(environ=os.environ):
    """The start of the command that launched this rank: ``python -m
    paddle.distributed.launch`` with its node and process counts, or ``python``."""
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
    """This run's command line with ``--from-checkpoint directory`` (replacing one given),
    or the same command line where it says ``--from-checkpoint auto``."""
    argv = list(sys.argv if argv is None else argv)
    if "--from-checkpoint=auto" in argv or ("--from-checkpoint", "auto") in zip(argv, argv[1:]):
        return shlex.join([*launcher_command(environ), *argv])
    kept, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg == "--from-checkpoint":
            skip = True
            continue
        if not arg.startswith("--from-checkpoint="):
            kept.append(arg)
    return shlex.join([*launcher_command(environ), argv[0], *kept, "--from-checkpoint", directory])


def stopped(number, where, directory):
    """The one line of a stopped run, and its exit code."""
    name = signal.Signals(number).name
    line = f"stopped by {name} {where}: saved {directory}; resume with: {resume_command(directory)}"
    return line, EXIT_CODES[number]
