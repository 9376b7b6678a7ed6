"""Bounded waiting in multi-rank jobs: a rank that makes no progress for
``--collective-timeout`` seconds ends the job with one line.

A rank that is alive but stuck (SIGSTOP, a hung driver) leaves its peers waiting in their
next collective: gloo's own timeout is hard-coded to about 115 days, and NCCL has none by
default in static mode. Each training step and evaluation batch calls ``beat``; a thread
ends the process (``errors.RESTARTABLE``) when the last beat is too old, so that
``paddle.distributed.launch`` ends the job.
"""

import contextlib
import os
import sys
import threading
import time

from paddle_resnet.core.errors import RESTARTABLE

_last_beat = [time.monotonic()]


def beat():
    _last_beat[0] = time.monotonic()


def _watch(timeout, message, stop):
    interval = min(5.0, timeout / 4)
    while not stop.wait(interval):
        idle = time.monotonic() - _last_beat[0]
        if idle > timeout:
            print(f"error: {message(idle)}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            # A thread cannot raise into the main thread while it waits inside a C++
            # collective: end the process, which the launcher sees.
            os._exit(RESTARTABLE)


@contextlib.contextmanager
def watching(timeout, message):
    """Inside the block, ``timeout`` seconds without a ``beat`` end the process in one line."""
    beat()
    stop = threading.Event()
    thread = threading.Thread(
        target=_watch, args=(timeout, message, stop), daemon=True, name="paddle-resnet-watchdog"
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
