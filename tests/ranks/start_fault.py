"""One rank of train.py whose start goes wrong on one rank, as a node can (a quota, a lock,
a hung file system or driver), for tests/test_start.py:

    START_FAULT=refuse:data:1 python -m paddle.distributed.launch ... tests/ranks/start_fault.py <flags>

``refuse:PHASE:RANK``: rank RANK refuses when its start enters PHASE (a DataError: status
2); ``block:PHASE:RANK``: it blocks there in C code holding the GIL (a locked mutex locked
again through ``ctypes.PyDLL``), as Paddle's ``TCPStore.get`` and its rendezvous do: no
thread of the rank runs, and no signal handler. Phases: ``run.py``'s ``guard.phase`` names.
"""

import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import ctypes
import os
import sys

from paddle_resnet.commands import train
from paddle_resnet.core import rank_guard
from paddle_resnet.core.errors import DataError

KIND, PHASE, RANK = os.environ["START_FAULT"].split(":")


def block_holding_the_gil():
    print(f"rank {RANK}: blocking in C with the GIL held", flush=True)
    libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call
    mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: zeros
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # a normal mutex: waits for ever, signals or not


def faulty(phase):
    def enter(self, name):
        phase(self, name)
        if name == PHASE and os.environ["PADDLE_TRAINER_ID"] == RANK:
            if KIND == "block":
                block_holding_the_gil()
            raise DataError(f"a refusal of rank {RANK} in phase {name} (the test's fault)")

    return enter


if __name__ == "__main__":
    rank_guard.RankGuard.phase = faulty(rank_guard.RankGuard.phase)
    sys.exit(train.main(sys.argv[1:]))
