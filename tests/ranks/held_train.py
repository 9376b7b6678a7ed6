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
"""

import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import os
import sys

from paddle_resnet.commands import train
from paddle_resnet.training import loop

HELD = "held at global step "


def held_from(step, function):
    """``loop.train_step`` that holds once, after the first call that reaches ``step``."""
    held = [False]

    def planted(exe, programs, *args, **kwargs):
        result = function(exe, programs, *args, **kwargs)
        reached = programs.lr_scheduler.last_epoch  # steps done, a resume's included
        if not held[0] and reached >= step:
            held[0] = True
            print(f"{HELD}{reached}", flush=True)
            sys.stdin.readline()
        return result

    return planted


if __name__ == "__main__":
    loop.train_step = held_from(int(os.environ["HOLD_AT_STEP"]), loop.train_step)
    sys.argv[0] = "train.py"
    sys.exit(train.main(sys.argv[1:]))
