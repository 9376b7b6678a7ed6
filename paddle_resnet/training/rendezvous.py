"""What the ranks of a job agree on before their first step, through the job's key-value
store: the TCP store that ``paddle.distributed.launch`` points every rank at
(PADDLE_MASTER, served by rank 0), which exists before any communicator ring on every
device. Collective ops are no channel here: on GPUs ring 0's NCCL communicator is made
by the startup program Fleet writes, after the start's decisions (docs/gpu.md).

- ``share``: rank 0's decision (``--from-checkpoint auto``'s choice, the data check's
  result) given to every rank;
- ``agree``: every rank has reached a point (before the programs are run: on GPUs the
  startup program's NCCL rendezvous; before the first step);
- ``end_start``: a rank that cannot start (a refusal, a fault) says so, with its status
  and line, before it exits; every rank waiting in ``share`` or ``agree``, or stopped by
  its launcher meanwhile, ends with the same status and a line naming that rank, so the
  job's status is the refusal's on every node (the launcher reports its first rank's).

A rank waits in Python, polling the store's counters (``Store.get`` of a missing key
blocks in C++ with the GIL held and aborts the process at its timeout): the rank's
signal handlers keep working, and the start's deadline is ``core/rank_guard.py``'s.
"""

import contextlib
import json
import time

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.errors import RestartableError, UserError, describe

PREFIX = "paddle_resnet/start"
POLL_SECONDS = 0.05
# A rank that ended the start, and rank 0, which serves the store, wait this long at most
# for the other ranks to read why (they look at their next wait) before they exit.
LINGER_SECONDS = 60.0


class PeerEnded(UserError):
    """Another rank ended the start with a refusal (status 2); ``RestartableError``'s
    counterpart is ``PeerEndedRestartable``."""


class PeerEndedRestartable(RestartableError):
    """Another rank ended the start with a fault a restart may fix (status 75)."""


class Rendezvous:
    """The start's agreements of rank ``rank`` of ``world_size`` over ``store``."""

    def __init__(self, store, rank, world_size):
        self.store, self.rank, self.world_size = store, rank, world_size

    @classmethod
    def of_job(cls, rank, world_size):
        """The start's agreements over the job's store (made by ``distributed.init_fleet``),
        or ``Alone``'s for one rank."""
        if world_size == 1:
            return Alone()
        return cls(paddle_internals.job_store(), rank, world_size)

    @contextlib.contextmanager
    def start(self):
        """Around a rank's start: an error that ends it is published (``end_start``)."""
        try:
            yield
        except (UserError, RestartableError, MemoryError, OSError) as err:
            with contextlib.suppress(RestartableError):  # the store is gone: nobody to tell
                self.end_start(err)
            raise

    def _count(self, key, add=0):
        try:
            return self.store.add(f"{PREFIX}/{key}", add)
        except (ValueError, RuntimeError) as err:  # Paddle's "TCP send error", ...
            raise RestartableError(
                f"rank {self.rank}: the job's key-value store is gone (rank 0 serves it: it "
                f"ended, see its log; {str(err).splitlines()[0]})"
            ) from None

    def share(self, name, value=None):
        """Rank 0's ``value`` (JSON-able), on every rank."""
        key = f"{PREFIX}/shared/{name}"
        if self.rank == 0:
            self.store.set(key, json.dumps(value))
            self._count(f"shared/{name}/ready", 1)
            return value
        self._wait(lambda: self._count(f"shared/{name}/ready") > 0)
        return json.loads(self.store.get(key))

    def agree(self, point):
        """Wait until every rank has reached ``point``."""
        self._count(f"reached/{point}", 1)
        self._wait(lambda: self._count(f"reached/{point}") >= self.world_size)

    def ended_by_peer(self):
        """A ``PeerEnded``/``PeerEndedRestartable`` naming the first rank that ended the
        start, or None (no rank did). Reading it tells rank 0 this rank has seen it."""
        if self._count("ended") == 0:
            return None
        for peer in range(self.world_size):
            if peer != self.rank and self._count(f"ended/{peer}") > 0:
                note = json.loads(self.store.get(f"{PREFIX}/why/{peer}"))
                self._count("seen", 1)  # rank 0 waits for every rank to know
                error = PeerEnded if note["status"] == 2 else PeerEndedRestartable
                return error(
                    f"rank {self.rank}: rank {peer} ended the start ({note['line']}): "
                    "this rank ends too"
                )
        return None

    def end_start(self, err):
        """This rank ends the start with ``err`` (an error ``errors.describe`` knows):
        published for the other ranks, unless it is another rank's end, read already.
        The rank that ended it, and rank 0, which serves the store, then wait until every
        rank knows (at most ``LINGER_SECONDS``): a rank still busy when its launcher saw a
        peer exit would be stopped by it, and killed 3 s later wherever it was."""
        peer_ended = isinstance(err, (PeerEnded, PeerEndedRestartable))
        if not peer_ended:
            status, line = describe(err)
            self.store.set(
                f"{PREFIX}/why/{self.rank}",
                json.dumps({"status": status, "line": line.removeprefix("error: ")}),
            )
            self._count(f"ended/{self.rank}", 1)
            self._count("ended", 1)
            self._count("seen", 1)
        if self.rank == 0 or not peer_ended:
            until = time.monotonic() + LINGER_SECONDS
            while self._count("seen") < self.world_size and time.monotonic() < until:
                time.sleep(POLL_SECONDS)

    def _wait(self, ready):
        while not ready():
            peer = self.ended_by_peer()
            if peer:
                raise peer
            time.sleep(POLL_SECONDS)


class Alone:
    """One rank: its decisions are everyone's, and nobody else can end its start."""

    rank, world_size = 0, 1

    def share(self, name, value=None):
        return value

    def agree(self, point):
        pass

    def ended_by_peer(self):
        return None

    @contextlib.contextmanager
    def start(self):
        yield
