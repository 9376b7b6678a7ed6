"""train.py with a hold point its test drives, so that a signal lands at a moment the test
makes rather than one it races for (a kill planned "0.4 s after step 18" landed after the
run had finished on a faster CPU):

    HOLD_AT_STEP=N python tests/ranks/held_train.py <train.py flags>

After the training step that brings the run to global step N or beyond (the first such
step of this process: a resumed run may start past N), the process prints
``held at global step K`` and waits for a line on its standard input. The test sends its
signal then (SIGTERM: the run saves at that step once released; SIGKILL: it dies there)
and releases it by writing a line. The run's own command line, as its resume line
prints it, is ``train.py``'s.

Under ``paddle.distributed.launch``: ``HOLD_RANK=R`` holds rank R alone (the others wait
for it in their next collective), and the line names the rank's pid (``pid N``) for the
test to signal it; the rank waits for ``HOLD_RELEASE`` (a path) to exist rather than for
its standard input. ``HOLD_RELEASE=signal``: the rank waits until a SIGTERM or SIGINT
reaches it however it travels (a scheduler's signal through a batch script and a launcher),
then handles it as train.py does. ``HOLD_STARTS=0,1``: hold only in those starts of a Slurm
job (its SLURM_RESTART_COUNT, 0 for the first), so that a later start runs through.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import os
import signal
import sys
import threading
import time

from paddle_resnet.commands import train
from paddle_resnet.training import loop

HELD = "held at global step "


def held_from(step, function, release=None):
    """``loop.train_step`` that holds once, after the first call that reaches ``step``,
    until a line on standard input (or until the path ``release`` exists)."""
    held = [False]

    def planted(exe, programs, *args, **kwargs):
        result = function(exe, programs, *args, **kwargs)
        reached = programs.lr_scheduler.last_epoch  # steps done, a resume's included
        if not held[0] and reached >= step:
            held[0] = True
            print(f"{HELD}{reached} (pid {os.getpid()})", flush=True)
            if release == "signal":
                until_signalled()
            elif release is None:
                sys.stdin.readline()
            else:
                while not os.path.exists(release):
                    time.sleep(0.05)
        return result

    return planted


def until_signalled():
    """Wait for a SIGTERM or SIGINT, handled by the handler train.py installed."""
    got = threading.Event()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}

    def noted(number, frame):
        got.set()
        handlers[number](number, frame)

    for number in handlers:
        signal.signal(number, noted)
    while not got.is_set():
        time.sleep(0.05)
    for number, handler in handlers.items():
        signal.signal(number, handler)


if __name__ == "__main__":
    rank = os.environ.get("HOLD_RANK")
    starts = os.environ.get("HOLD_STARTS")
    this_start = os.environ.get("SLURM_RESTART_COUNT", "0")
    if rank in (None, os.environ.get("PADDLE_TRAINER_ID")) and (
        starts is None or this_start in starts.split(",")
    ):
        step, release = int(os.environ["HOLD_AT_STEP"]), os.environ.get("HOLD_RELEASE")
        loop.train_step = held_from(step, loop.train_step, release)
    sys.argv[0] = "train.py"
    sys.exit(train.main(sys.argv[1:]))
