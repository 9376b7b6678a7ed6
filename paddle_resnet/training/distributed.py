"""Processes and devices: Fleet's collective mode, this process's device, sums over ranks.

One process per device, whether started by ``paddle.distributed.launch`` or plainly.
On GPUs the ranks talk through NCCL, set up by Fleet itself. Where there is no GPU
they talk through gloo, which needs adaptations of Fleet's collective path, all here
and nowhere else: gloo creates the ring that Fleet's NCCL/BKCL communicator set-up
would (``init_fleet``), and around ``minimize`` (``collective_rewrite``) that set-up
is skipped and the stream-sync ops, which have no CPU kernel and mean nothing without
streams, are removed. Paddle 3.x looks communicators up by ring id, so there gloo's
ring 0 is registered with its communicator manager instead, and AMP's per-parameter
finite check for distributed runs (a GPU overlap optimisation whose ``paddle.any``
rejects legacy static variables) is not switched on.
"""

import contextlib
import os
import signal
import stat
import sys

import numpy as np
import paddle
from paddle.distributed import fleet

from paddle_resnet.core import bootstrap, paddle_internals, watchdog
from paddle_resnet.core.bootstrap import paddle_chatter
from paddle_resnet.core.devices import gpu_available
from paddle_resnet.core.errors import (
    RestartableError,
    UserError,
    stopped_status,
)
from paddle_resnet.core.rank_guard import RankGuard
from paddle_resnet.training import ir

STREAM_SYNC_OPS = ("c_sync_comm_stream", "c_sync_calc_stream")


def launcher_ranks(environ=os.environ):
    """(rank, endpoints) that ``paddle.distributed.launch`` gave this process; UserError
    naming the variable when its environment is incomplete or inconsistent."""
    endpoints = [e for e in environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e]
    if len(endpoints) <= 1:
        return 0, endpoints
    where = f"PADDLE_TRAINER_ENDPOINTS names {len(endpoints)} ranks"
    if environ.get("PADDLE_TRAINERS_NUM", str(len(endpoints))) != str(len(endpoints)):
        raise UserError(
            f"{where} but PADDLE_TRAINERS_NUM is {environ['PADDLE_TRAINERS_NUM']}; "
            "start the ranks with python -m paddle.distributed.launch"
        )
    rank = environ.get("PADDLE_TRAINER_ID", "")
    if not rank.isdigit() or int(rank) >= len(endpoints):
        raise UserError(
            f"{where} but PADDLE_TRAINER_ID is {rank or 'not set'}; "
            "start the ranks with python -m paddle.distributed.launch"
        )
    if not environ.get("PADDLE_MASTER"):
        raise UserError(
            f"{where} but PADDLE_MASTER is not set: the ranks meet at the key-value store "
            "of paddle.distributed.launch (give it --master, or no --ips / --start_port)"
        )
    if environ.get("PADDLE_CURRENT_ENDPOINT") != endpoints[int(rank)]:
        raise UserError(
            f"{where} but PADDLE_CURRENT_ENDPOINT "
            f"({environ.get('PADDLE_CURRENT_ENDPOINT', 'not set')}) is not rank "
            f"{rank}'s; start the ranks with python -m paddle.distributed.launch"
        )
    return int(rank), endpoints


def uses_gloo():
    """True for a multi-rank job without GPUs (after ``init_fleet``; a process that has not
    joined a job, e.g. ``program.py`` building PIR programs, is one rank)."""
    return paddle_internals.fleet_initialized() and fleet.worker_num() > 1 and not gpu_available()


def init_fleet():
    """Fleet in collective mode (once per process), with gloo between CPU ranks;
    returns (rank, world size)."""
    if paddle_internals.fleet_initialized():
        return fleet.worker_index(), fleet.worker_num()
    # Static mode first: in dynamic mode fleet.init starts a dygraph process group of
    # its own (on Paddle 3.x a second owner of ring 0).
    paddle.enable_static()
    rank, endpoints = launcher_ranks()
    if len(endpoints) > 1:
        # the job's key-value store, the start's channel (``rendezvous.py``): a rendezvous of
        # every rank, before any ring (gloo's on Paddle 3 is made over it)
        paddle_internals.job_store()
    if len(endpoints) > 1 and not gpu_available():
        with paddle_chatter(bootstrap.verbose()):  # "server not ready, wait 3 sec" lines
            paddle_internals.init_gloo_ring(rank, endpoints)
    with paddle_chatter(bootstrap.verbose()):
        fleet.init(is_collective=True)
    return fleet.worker_index(), fleet.worker_num()


@contextlib.contextmanager
def collective_rewrite(main, startup):
    """Around Fleet's ``minimize``: on CPU ranks, gloo's ring instead of NCCL's set-up
    and no stream-sync ops in ``main`` and ``startup``. Changes nothing on GPUs or with
    one rank."""
    if not uses_gloo():
        yield
        return
    with paddle_internals.fleet_over_gloo():
        yield
    for program in (main, startup):
        paddle_internals.remove_ops(program, STREAM_SYNC_OPS)


class StoppedBySignal(Exception):
    """SIGTERM or SIGINT arrived outside the training steps (which stop at a step:
    ``stopping.py``); ``number`` is the signal."""

    def __init__(self, number):
        super().__init__(number)
        self.number = number


def _stopped(signum, frame):
    raise StoppedBySignal(signum)


def _ranks_launched(environ):
    return len([e for e in environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e]) > 1


class Stops:
    """What ``stops_reported`` knows of the run: its start's ``rendezvous`` once the ranks
    have met (where another rank's end of the start is read)."""

    rendezvous = None


@contextlib.contextmanager
def stops_reported(environ=os.environ):
    """For a whole run: SIGTERM or SIGINT outside the training steps (start-up, the
    summary; the steps themselves stop at one, saved) end the run with one line, where
    Python printed a KeyboardInterrupt traceback and Paddle's handler a C++ "Termination
    signal" dump. A rank of a multi-rank job gets SIGTERM from its launcher when another
    rank ended (e.g. failed, or refused the same bad input first): a crash the other's
    log explains (``RestartableError``; the launcher's status is the first rank's that
    ended non-zero). A single process was stopped, resumable: status 128 + the signal.
    ``peers_watched`` says more once training runs. A rank stopped during the start because
    another rank ended it (a refusal: the launcher stops the others) ends with that rank's
    status and says why (``rendezvous.Rendezvous.ended_by_peer``)."""
    launched = _ranks_launched(environ)
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
    """For a process started by ``paddle.distributed.launch``, a watcher process
    (``core/rank_guard.py``) that ends it when the launcher dies (the OOM killer's
    SIGKILL: not to live on as an orphan holding the output folder's lock) or when its
    start takes more than ``start_timeout`` seconds; yields the ``RankGuard`` to tell it
    the start's phases. A process, not a thread: the rank's main thread can block in
    Paddle's C++ holding the GIL. (PR_SET_PDEATHSIG would fire on the death of the
    launcher's thread that started the rank, not of the launcher.)"""
    if not bootstrap.launched(environ):
        yield _Unguarded()
        return
    guard = RankGuard(
        environ.get("PADDLE_TRAINER_ID", "?"), bootstrap.PARENT_AT_START, start_timeout
    )
    try:
        yield guard
    finally:
        guard.close()


def tell_launcher_console(line, environ=os.environ):
    """Also write ``line`` on the console of ``paddle.distributed.launch``, where it would
    not appear: the launcher echoes its first rank's log (--log_dir) while it watches
    the job, but once it is stopping itself (a SIGTERM from Slurm or Kubernetes, Ctrl-C)
    it closes that log first, and the console showed only "Terminating with signal 15".
    Whether it still echoes is read from its open files (two handles on this rank's log
    while it does: the rank's output and the reader; none once it stops the ranks).
    Written where the launcher's output goes if that is a terminal, a pipe or a file
    opened for appending (Slurm's --open-mode=append); a file the launcher writes at its
    own offset (``> file``) would have its next line written over this one."""
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
def peers_watched(rank, world_size, checkpoints, timeout):
    """Turn another rank's death, or its being stuck for ``timeout`` seconds, into one
    line naming it, however it reaches this rank.

    When a rank dies (killed, out of memory, a data error), the survivors' next
    all-reduce fails at once (gloo: the connection closes), and Paddle's own error says
    only "std::exception". Or the launcher, seeing the dead rank first, sends SIGTERM,
    which would otherwise end this rank without a word. A rank that is stuck but alive
    (stopped, hung) makes the others wait inside a collective: ``watchdog`` ends them.
    """
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

    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        with watchdog.watching(timeout, stuck):
            yield
    except StoppedBySignal:
        raise RestartableError(
            f"rank {rank}: {who} stopped (killed, or failed: see its log in the "
            f"launcher's --log_dir), and the launcher ended this rank (SIGTERM). "
            f"{resume}"
        ) from None
    except RuntimeError as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise RestartableError(
            f"rank {rank}: {who} stopped (killed, or failed: see its log in the "
            f"launcher's --log_dir); a collective operation failed ({reason}). "
            f"{resume}"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def parameter_checksum(program):
    """The sum of every trained parameter of ``program``, in float64. (BN running
    statistics are parameters too, but each rank keeps its own, from its own batches.)"""
    scope = paddle.static.global_scope()
    return float(
        sum(
            np.asarray(scope.find_var(p.name).get_tensor(), dtype=np.float64).sum()
            for p in ir.parameters(program)
            if p.trainable
        )
    )


def check_ranks_agree(program, all_reduce, where):
    """UserError unless every rank holds the same parameters (compared by checksum):
    data parallelism that lets ranks drift apart trains N different models."""
    checksum = parameter_checksum(program)
    total, squares, ranks, _ = all_reduce(np.array([checksum, checksum**2, 1.0, 0.0]))
    spread = squares / ranks - (total / ranks) ** 2
    if spread > 1e-12 * max(1.0, (total / ranks) ** 2):
        raise UserError(
            f"the {int(ranks)} ranks hold different parameters {where} (checksum "
            f"spread {spread:.3g}): gradients were not reduced alike"
        )
    return checksum


def all_reduce_program(name, shape, dtype):
    """A static program summing the feed ``name`` over all ranks; (program, its output)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        values = paddle.static.data(name, shape, dtype)
        if paddle_internals.is_pir_program(main):
            paddle.distributed.all_reduce(values)
        elif paddle_internals.PADDLE3:
            # paddle.distributed.all_reduce rejects legacy static variables on 3.x.
            main.global_block().append_op(
                type="all_reduce",
                inputs={"x": [values]},
                outputs={"out": [values]},
                attrs={"ring_id": 0, "reduce_type": paddle.distributed.ReduceOp.SUM},
            )
        else:
            paddle.distributed.all_reduce(values)
    if uses_gloo() and not paddle_internals.is_pir_program(main):
        paddle_internals.remove_ops(main, STREAM_SYNC_OPS)
    return main, values


def all_reduce_sum(place):
    """A function summing a float64 vector over all ranks (a static collective op; one
    program per vector length, built when first asked for: the stop requests' and
    evaluation counts' 4 numbers, an evaluation's confusion matrix)."""
    exe = paddle.static.Executor(place)
    programs = {}

    def reduce(values):
        values = np.asarray(values, dtype=np.float64)
        if len(values) not in programs:
            programs[len(values)] = all_reduce_program("counts", [len(values)], "float64")
        main, counts = programs[len(values)]
        return np.asarray(exe.run(main, feed={"counts": values}, fetch_list=[counts])[0])

    return reduce
