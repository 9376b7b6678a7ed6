"""What the ranks of a job agree on before their first step, through the job's key-value
store (PADDLE_MASTER, served by rank 0), which exists before any communicator ring: on
GPUs ring 0's NCCL communicator is made by Fleet's startup program, after the start's
decisions (docs/gpu.md). ``share``: rank 0's decision given to every rank; ``agree``:
every rank has reached a point; ``end_start``: a rank that cannot start publishes its
status and line, and every rank waiting ends with them, so the job's status is the
refusal's on every node.

A rank waits in Python, polling the store's counters (``Store.get`` of a missing key
blocks in C++ with the GIL held and aborts the process at its timeout), so its signal
handlers keep working. The polls back off (``poll_pauses``): a quick peer is seen within
milliseconds, a long wait (rank 0 screening ImageNet) asks the store twice a second.
What a rank reads from the store is checked before it is used (``_read``, ``share``'s
``check``, ``_where``)."""

import contextlib
import json
import os
import re
import socket
import sys
import time

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.errors import UNEXPECTED, RestartableError, UserError, describe
from paddle_resnet.training.lifecycle import StoppedBySignal

PREFIX = "paddle_resnet/start"
# A wait's pauses between two polls: the first short, then doubling to the longest.
FIRST_POLL_SECONDS = 0.01
LONGEST_POLL_SECONDS = 1.0
# The checkpoint folder names the toolkit writes (``checkpoint.checkpoint_name``): ASCII
# digits only, so that no shared name can reach outside <output-dir>/<arch>.
CHECKPOINT_NAME = re.compile(r"[0-9]+(-step[0-9]+)?")
# Where a rank runs, as ``start`` writes it: "<host> <process id>" (the id names /proc/<id>).
PLACE = re.compile(r"(\S+) ([0-9]{1,10})")
# A rank that ended the start, and rank 0, wait this long at most for the others to read why.
LINGER_SECONDS = 60.0
# After a collective failed, how long the survivors wait for each other's answer: well
# within the 30 s the launcher gives between its SIGTERM and its SIGKILL.
ROLL_CALL_SECONDS = 2.0
# Rank 0 keeps the store up for the survivors' roll call at most this long after it began
# its own, and ends before the launcher's kill, which comes 3 s after its SIGTERM at the
# soonest (paddle/distributed/launch/controllers/controller.py, ``pod.stop(timeout=3)``).
LAUNCHER_GRACE_SECONDS = 2.5


class PeerEnded(UserError):
    """Another rank ended the start with a refusal (status 2)."""


class PeerEndedRestartable(RestartableError):
    """Another rank ended the start with a fault a restart may fix (status 75)."""


def poll_pauses(first=FIRST_POLL_SECONDS, longest=LONGEST_POLL_SECONDS):
    """A wait's pauses between polls: ``first``, doubling, at most ``longest``."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, longest)


def checkpoint_name_problem(name):
    """Why ``name``, read from the job's store, cannot be ``--from-checkpoint auto``'s
    choice ("17", "2-step6", or None: no checkpoint yet), or None."""
    if name is None or (isinstance(name, str) and CHECKPOINT_NAME.fullmatch(name)):
        return None
    return "not the name of a checkpoint folder (<epochs> or <epoch>-step<steps>)"


def _note_problem(note):
    """Why ``note``, a peer's end read from the store, is not what ``end_start`` writes."""
    if isinstance(note, dict) and type(note.get("status")) is int:
        if isinstance(note.get("line"), str):
            return None
    return "not a rank's end (its status and line)"


def ending(rank, err):
    """(exit status, line) of ``err`` ending rank ``rank``'s start: ``errors.describe``'s,
    or for any other exception (a bug) ``errors.UNEXPECTED``, which schedulers retry."""
    if isinstance(err, (UserError, RestartableError, MemoryError, OSError)):
        status, line = describe(err)
        return status, line.removeprefix("error: ")
    message = str(err).strip().splitlines()
    said = f": {message[0]}" if message else ""
    return (
        UNEXPECTED,
        f"an unexpected {type(err).__name__}{said}; a bug: rank {rank}'s log has its traceback",
    )


class Rendezvous:
    """The start's agreements of rank ``rank`` of ``world_size`` over ``store``."""

    def __init__(self, store, rank, world_size, sleep=time.sleep, clock=time.monotonic):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.sleep, self.clock = sleep, clock

    @classmethod
    def of_job(cls, rank, world_size):
        """Over the job's store (``distributed.init_fleet`` made it); ``Alone`` for one rank."""
        if world_size == 1:
            return Alone()
        return cls(paddle_internals.job_store(), rank, world_size)

    @contextlib.contextmanager
    def start(self):
        """Around a rank's start: any exception that ends it is published (``end_start``),
        a bug also said here in one line before its traceback. A stop by a signal
        (``lifecycle.stops_reported`` reports it), KeyboardInterrupt and SystemExit pass."""
        try:
            # where this rank runs, for a roll call's survivors on the same host
            self._call("set", f"where/{self.rank}", f"{socket.gethostname()} {os.getpid()}")
            self._count(f"where/{self.rank}/ready", 1)
            yield
        except StoppedBySignal:
            raise
        except Exception as err:
            status, line = ending(self.rank, err)
            if status == UNEXPECTED:
                print(
                    f"error: rank {self.rank}: the start ended by {line}",
                    file=sys.stderr,
                    flush=True,
                )
            with contextlib.suppress(RestartableError):  # the store is gone: nobody to tell
                self.end_start(err)
            raise

    def _call(self, method, key, *args):
        try:
            return getattr(self.store, method)(f"{PREFIX}/{key}", *args)
        except (ValueError, RuntimeError) as err:  # Paddle's "TCP send error", ...
            raise RestartableError(
                f"rank {self.rank}: the job's key-value store is gone (rank 0 serves it: it "
                f"ended, see its log; {(str(err).splitlines() or [type(err).__name__])[0]})"
            ) from None

    def _count(self, key, add=0):
        return self._call("add", key, add)

    def share(self, name, value=None, check=None):
        """Rank 0's ``value`` (JSON-able), on every rank. ``check(value)``: why a value
        cannot be used (it will name a file), or None; a refusal ends every rank's start."""
        key = f"shared/{name}"
        if self.rank == 0:
            self._checked(key, value, check)  # rank 0 refuses it as the others would
            self._call("set", key, json.dumps(value))
            self._count(f"{key}/ready", 1)
            return value
        self._wait(lambda: self._count(f"{key}/ready") > 0)
        return self._checked(key, self._read(key), check)

    def _read(self, key, problem=None):
        """The JSON value under ``key``; one that is not JSON, or that ``problem(value)``
        refuses, ends the start in one line naming the key (status 2)."""
        raw = self._call("get", key)
        try:
            value = json.loads(raw)
        except (TypeError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            value, why = raw, "not JSON as the toolkit writes it"
        else:
            why = problem(value) if problem else None
        if why:
            raise self._refusal(key, value, f": {why}; refused")
        return value

    def _checked(self, key, value, check):
        problem = check(value) if check else None
        if problem:
            raise self._refusal(
                key, value, f" (rank 0's choice): {problem}; refused, it would name a file"
            )
        return value

    def _refusal(self, key, value, why):
        """The one line refusing ``value`` read under ``key`` (up to 200 characters)."""
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        return UserError(
            f"rank {self.rank}: the job's key-value store holds {shown} under '{PREFIX}/{key}'{why}"
        )

    def agree(self, point):
        self._count(f"reached/{point}", 1)
        self._wait(lambda: self._count(f"reached/{point}") >= self.world_size)

    def ended_by_peer(self):
        """A ``PeerEnded``/``PeerEndedRestartable`` naming the first rank that ended the
        start, or None. Reading it tells rank 0 this rank has seen it."""
        if self._count("ended") == 0:
            return None
        for peer in range(self.world_size):
            if peer != self.rank and self._count(f"ended/{peer}") > 0:
                note = self._read(f"why/{peer}", _note_problem)
                self._count("seen", 1)  # rank 0 waits for every rank to know
                error = PeerEnded if note["status"] == 2 else PeerEndedRestartable
                return error(
                    f"rank {self.rank}: rank {peer} ended the start ({note['line']}): "
                    "this rank ends too"
                )
        return None

    def end_start(self, err):
        """This rank ends the start with ``err``, published unless it is a peer's end. The
        rank that ended it, and rank 0 (the store), then wait until every rank knows (at
        most ``LINGER_SECONDS``, or until the launcher's SIGTERM): the launcher stops a
        rank still busy when a peer exits, and kills it 3 s later wherever it was."""
        peer_ended = isinstance(err, (PeerEnded, PeerEndedRestartable))
        if not peer_ended:
            status, line = ending(self.rank, err)
            self._call("set", f"why/{self.rank}", json.dumps({"status": status, "line": line}))
            self._count(f"ended/{self.rank}", 1)
            self._count("ended", 1)
            self._count("seen", 1)
        if self.rank == 0 or not peer_ended:
            # The launcher's SIGTERM ends the wait, not the rank's status: it comes once a
            # peer exited, which the peer does once it has read why (or it cannot).
            with contextlib.suppress(StoppedBySignal):
                until = self.clock() + LINGER_SECONDS
                for pause in poll_pauses():
                    if self._count("seen") >= self.world_size or self.clock() >= until:
                        return
                    self.sleep(pause)

    def roll_call(self, seconds=ROLL_CALL_SECONDS):
        """Once a collective has failed: the ranks that stopped, sorted, or None where the
        store (rank 0) is gone. A silent peer on this host is looked up by its process;
        one elsewhere silent for ``seconds`` is named. Rank 0 then keeps the store up
        until the others have read (else they would name rank 0), within the launcher's
        grace (it kills no sooner than 3 s after a death)."""
        try:
            self._count(f"roll-call/{self.rank}", 1)
            peers = [peer for peer in range(self.world_size) if peer != self.rank]
            here = {peer: self._where(peer) for peer in peers}
            remote = [p for p in peers if here[p] is None]
            begun = self.clock()
            for pause in poll_pauses():
                silent = [p for p in remote if self._count(f"roll-call/{p}") == 0]
                if not silent or self.clock() >= begun + seconds:
                    break
                self.sleep(pause)
            gone_here = [p for p in peers if here[p] is not None and not _running(here[p])]
            stopped = sorted(p for p in silent + gone_here if self._count(f"roll-call/{p}") == 0)
            self._count(f"roll-call-read/{self.rank}", 1)
            _write_verdict(stopped)
            if self.rank == 0:  # the store's host: up until the others have read
                readers = [p for p in peers if p not in stopped]
                for pause in poll_pauses():
                    if self.clock() >= begun + LAUNCHER_GRACE_SECONDS or all(
                        self._count(f"roll-call-read/{p}") for p in readers
                    ):
                        break
                    self.sleep(pause)
            return stopped
        except RestartableError:  # the store is gone: what a survivor of this host said, if any
            return _read_verdict()

    def _where(self, peer):
        """The process id of ``peer`` where it runs on this host, else None."""
        if self._count(f"where/{peer}/ready") == 0:
            return None
        value = self._call("get", f"where/{peer}")  # bytes (Paddle's store), or a str
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        place = PLACE.fullmatch(text)  # anything else: no place on this host
        host, pid = place.groups() if place else (None, None)
        return int(pid) if host == socket.gethostname() else None

    def _wait(self, ready):
        """Until ``ready()``, ending where a peer ended the start."""
        for pause in poll_pauses():
            if ready():
                return
            peer = self.ended_by_peer()
            if peer:
                raise peer
            self.sleep(pause)


def _verdict_path(environ=os.environ):
    """Where this host's survivors leave their roll call's verdict, for a rank freed only
    once rank 0, and the store, is gone."""
    folder, master = environ.get("PADDLE_LOG_DIR"), environ.get("PADDLE_MASTER", "")
    if not folder:
        return None
    return os.path.join(folder, f".roll-call-{re.sub(r'[^0-9A-Za-z]', '-', master)}.json")


def _write_verdict(stopped):
    path = _verdict_path()
    if path is None:
        return
    with contextlib.suppress(OSError):  # a verdict is a courtesy to the late ranks
        staged = f"{path}.{os.getpid()}"
        with open(staged, "w") as handle:
            json.dump(stopped, handle)
        os.replace(staged, path)


def _read_verdict():
    """The stopped ranks a survivor of this host found during this process's life, else
    None (rank 0 is the one gone)."""
    path = _verdict_path()
    try:
        if path is None or os.stat(path).st_mtime < _process_started():
            return None  # none, or an earlier job's
        with open(path) as handle:
            stopped = json.load(handle)
    except (OSError, ValueError):
        return None
    if isinstance(stopped, list) and all(isinstance(r, int) for r in stopped):
        return stopped
    return None


def _process_started():
    """When this process started (its /proc folder's time), or 0."""
    try:
        return os.stat(f"/proc/{os.getpid()}").st_ctime
    except OSError:
        return 0.0


def _running(pid):
    """Whether process ``pid`` of this host runs (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Alone:
    """One rank: its decisions are everyone's, and nobody else can end its start."""

    rank, world_size = 0, 1

    def share(self, name, value=None, check=None):
        problem = check(value) if check else None
        if problem:  # the one rank's own choice: refused as a peer's would be
            raise UserError(f"the start's choice {name!r} is {value!r}: {problem}")
        return value

    def agree(self, point):
        pass

    def ended_by_peer(self):
        return None

    def roll_call(self, seconds=0.0):
        return []

    @contextlib.contextmanager
    def start(self):
        yield
