"""One rank of train.py whose start goes wrong on one rank, as a node can (a quota, a lock,
a hung file system or driver, a bug), or whose teardown is stuck, for tests/test_start.py:

    START_FAULT=refuse:data:1 python -m paddle.distributed.launch ... tests/ranks/start_fault.py <flags>

``refuse:PHASE:RANK``: rank RANK refuses when its start enters PHASE (a DataError: status
2); ``ValueError:PHASE:RANK``, ``RuntimeError:PHASE:RANK``: it raises that plain exception
there (what a bug raises: no error the toolkit knows); ``block:PHASE:RANK``: it blocks
there in C code holding the GIL (a locked mutex locked again through ``ctypes.PyDLL``), as
Paddle's ``TCPStore.get`` and its rendezvous do: no thread of the rank runs, and no signal
handler; ``watchers:PHASE:RANK``: it prints how many watcher processes
(``core/rank_guard.py``) it has, then refuses (works without the launcher too: rank 0);
``hold-teardown:-:RANK``: the run finishes, then rank RANK blocks holding the GIL instead
of exiting, as a teardown stuck in Paddle's C++ does; ``shared-name:NAME:0``: rank 0
shares NAME as ``--from-checkpoint auto``'s choice, unchecked, as a store that another
process wrote into would hold it. Phases: ``run.py``'s ``guard.phase`` names.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import ctypes
import os
import sys

from paddle_resnet.commands import train
from paddle_resnet.core import rank_guard
from paddle_resnet.core.errors import DataError
from paddle_resnet.training import lifecycle, rendezvous

KIND, PHASE, RANK = os.environ["START_FAULT"].split(":")
THIS_RANK = os.environ.get("PADDLE_TRAINER_ID", "0")  # 0: a process without the launcher
PLAIN_EXCEPTIONS = {"ValueError": ValueError, "RuntimeError": RuntimeError}


def block_holding_the_gil(what):
    print(f"rank {RANK}: blocking in C with the GIL held ({what})", flush=True)
    libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call
    mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: zeros
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # a normal mutex: waits for ever, signals or not


def watcher_processes():
    """The processes this one started that run core/rank_guard.py."""
    found = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        found += parent == os.getpid() and b"rank_guard.py" in command
    return found


def faulty(phase):
    def enter(self, name):
        phase(self, name)
        if name != PHASE or THIS_RANK != RANK:
            return
        if KIND == "block":
            block_holding_the_gil(f"phase {name}")
        if KIND in PLAIN_EXCEPTIONS:
            raise PLAIN_EXCEPTIONS[KIND](
                f"a {KIND} of rank {RANK} in phase {name} (the test's fault)"
            )
        if KIND == "watchers":
            print(f"rank {RANK}: watcher processes: {watcher_processes()}", flush=True)
        raise DataError(f"a refusal of rank {RANK} in phase {name} (the test's fault)")

    return enter


def planted(share):
    def share_planted(self, name, value=None, *args, **kwargs):
        if name == "from-checkpoint auto" and THIS_RANK == RANK:
            share(self, name, PHASE)  # PHASE: the name planted, unchecked, for the others
            return value  # rank 0 itself goes on with its own choice
        return share(self, name, value, *args, **kwargs)

    return share_planted


if __name__ == "__main__":
    if KIND == "shared-name":
        rendezvous.Rendezvous.share = planted(rendezvous.Rendezvous.share)
    rank_guard.RankGuard.phase = faulty(rank_guard.RankGuard.phase)
    lifecycle._Unguarded.phase = faulty(lifecycle._Unguarded.phase)  # a process not launched
    status = train.main(sys.argv[1:])
    if KIND == "hold-teardown" and THIS_RANK == RANK:
        block_holding_the_gil(f"teardown, after its run ended with status {status}")
    sys.exit(status)
