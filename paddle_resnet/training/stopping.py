"""Ctrl-C and SIGTERM during training (what Slurm, Kubernetes and preemptible clouds send
before SIGKILL): the step in flight finishes, a checkpoint is written at that step, one
line says what was saved and how to resume, and the process exits 130 (SIGINT) or 143
(SIGTERM). A second signal ends the process at once (the default action: no traceback,
no Paddle dump); the checkpoints already written are complete, as ever.

The grace period is one training step plus the checkpoint write (ResNet-50 on one
A100: about 0.3 s and 0.5 s; on 2 CPU cores at 224 px about 5 s and 1 s): schedulers
give 30 s (Kubernetes' default) or more. With several ranks the launcher's own stop
applies (``distributed.launcher_stop_reported``): each rank would have to agree on the
step, which this does not do yet.
"""

import shlex
import signal
import sys

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class StopRequests:
    """While entered (main thread), SIGINT and SIGTERM ask the training to stop after its
    current step: ``signal_number`` is then set."""

    def __init__(self):
        self.signal_number = None
        self._previous = {}

    def __enter__(self):
        for number in EXIT_CODES:
            self._previous[number] = signal.signal(number, self._request)
        return self

    def __exit__(self, *exc_info):
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _request(self, number, frame):
        self.signal_number = number
        for other in EXIT_CODES:  # a second signal: the default action, at once
            signal.signal(other, signal.SIG_DFL)

    @property
    def requested(self):
        return self.signal_number is not None


def resume_command(directory, argv=None):
    """This run's command line with ``--from-checkpoint directory`` (replacing one given)."""
    argv = list(sys.argv if argv is None else argv)
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
    return shlex.join(["python", argv[0], *kept, "--from-checkpoint", directory])


def stopped(number, where, directory):
    """The one line of a stopped run, and its exit code."""
    name = signal.Signals(number).name
    line = f"stopped by {name} {where}: saved {directory}; resume with: {resume_command(directory)}"
    return line, EXIT_CODES[number]
