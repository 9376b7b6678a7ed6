"""Processes and devices: Fleet's collective mode, this process's device, sums over ranks.

One process per device. Ring 0, which every collective uses, is made before any program
(``init_fleet``): NCCL between GPUs, gloo between CPU ranks; around ``minimize``
(``collective_rewrite``) Fleet's own set-up of it is skipped. Without a GPU the
stream-sync ops, which have no CPU kernel, are removed.
"""

import contextlib
import os

import numpy as np
import paddle
from paddle.distributed import fleet

from paddle_resnet.core import bootstrap, devices, paddle_internals
from paddle_resnet.core.bootstrap import paddle_chatter
from paddle_resnet.core.errors import RestartableError, UserError
from paddle_resnet.training import ir

STREAM_SYNC_OPS = ("c_sync_comm_stream", "c_sync_calc_stream")


def launcher_ranks(environ=os.environ):
    """(rank, endpoints) that ``paddle.distributed.launch`` gave this process."""
    endpoints = [e for e in environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e]
    if len(endpoints) <= 1:
        return 0, endpoints
    where = f"PADDLE_TRAINER_ENDPOINTS names {len(endpoints)} ranks"
    launch = "start the ranks with python -m paddle.distributed.launch"
    if environ.get("PADDLE_TRAINERS_NUM", str(len(endpoints))) != str(len(endpoints)):
        raise UserError(
            f"{where} but PADDLE_TRAINERS_NUM is {environ['PADDLE_TRAINERS_NUM']}; {launch}"
        )
    rank = environ.get("PADDLE_TRAINER_ID", "")
    if not rank.isdigit() or int(rank) >= len(endpoints):
        raise UserError(f"{where} but PADDLE_TRAINER_ID is {rank or 'not set'}; {launch}")
    if not environ.get("PADDLE_MASTER"):
        raise UserError(
            f"{where} but PADDLE_MASTER is not set: the ranks meet at the key-value store "
            "of paddle.distributed.launch (give it --master, or no --ips / --start_port)"
        )
    if environ.get("PADDLE_CURRENT_ENDPOINT") != endpoints[int(rank)]:
        raise UserError(
            f"{where} but PADDLE_CURRENT_ENDPOINT "
            f"({environ.get('PADDLE_CURRENT_ENDPOINT', 'not set')}) is not rank {rank}'s; {launch}"
        )
    return int(rank), endpoints


def uses_gloo():
    """A multi-rank job without GPUs (after ``init_fleet``; else one rank)."""
    return (
        paddle_internals.fleet_initialized()
        and fleet.worker_num() > 1
        and not devices.gpu_available()
    )


def init_fleet():
    """Fleet in collective mode (once per process) and, with several ranks, the job's
    store and ring 0, before any program; (rank, world size)."""
    if paddle_internals.fleet_initialized():
        return fleet.worker_index(), fleet.worker_num()
    # Static mode first: in dynamic mode fleet.init starts a dygraph process group of
    # its own (on Paddle 3.x a second owner of ring 0).
    paddle.enable_static()
    rank, endpoints = launcher_ranks()
    if len(endpoints) > 1:
        # the job's key-value store (``rendezvous.py``), before any ring (made over it)
        paddle_internals.job_store()
        place, device_id = devices.device()
        with paddle_chatter(bootstrap.verbose()):  # "server not ready, wait 3 sec" lines
            paddle_internals.make_ring0(rank, endpoints, place, device_id)
    with paddle_chatter(bootstrap.verbose()):
        fleet.init(is_collective=True)
    return fleet.worker_index(), fleet.worker_num()


@contextlib.contextmanager
def collective_rewrite(main, startup):
    """Around Fleet's ``minimize`` of a multi-rank job: ring 0 as ``init_fleet`` made it
    and, on CPU ranks, no stream-sync ops in ``main`` and ``startup``."""
    if not (paddle_internals.fleet_initialized() and fleet.worker_num() > 1):
        yield
        return
    gloo = uses_gloo()
    with paddle_internals.fleet_on_ring0(gloo):
        yield
    if gloo:
        for program in (main, startup):
            paddle_internals.remove_ops(program, STREAM_SYNC_OPS)


def parameter_checksum(program):
    """The float64 sum of ``program``'s trained parameters (each rank's BN statistics
    are its own)."""
    scope = paddle.static.global_scope()
    return float(
        sum(
            np.asarray(scope.find_var(p.name).get_tensor(), dtype=np.float64).sum()
            for p in ir.parameters(program)
            if p.trainable
        )
    )


class RanksDisagree(RestartableError):
    """The ranks hold different parameters after the same steps: a hardware fault."""


def check_ranks_agree(program, all_reduce, where):
    """``RanksDisagree`` on every rank unless every rank's checksum is the same."""
    checksum = parameter_checksum(program)
    total, squares, ranks, _ = all_reduce(np.array([checksum, checksum**2, 1.0, 0.0]))
    spread = squares / ranks - (total / ranks) ** 2
    if spread > 1e-12 * max(1.0, (total / ranks) ** 2):
        raise RanksDisagree(
            f"the {int(ranks)} ranks hold different parameters {where} (checksum "
            f"spread {spread:.3g}) although they applied the same summed gradients: a "
            "hardware fault (a device's memory or the interconnect corrupted data); nothing "
            "was saved, a restart continues from the last checkpoint (check the nodes' "
            "health, e.g. nvidia-smi -q -d ECC, if it happens again)"
        )
    return checksum


def all_reduce_program(name, shape, dtype):
    """A static program summing the feed ``name`` over all ranks; (program, its output)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        values = paddle.static.data(name, shape, dtype)
        if paddle_internals.PADDLE3 and not paddle_internals.is_pir_program(main):
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
    """A function summing a float64 vector over all ranks (one static program per vector
    length, built when first asked for)."""
    exe = paddle.static.Executor(place)
    programs = {}

    def reduce(values):
        values = np.asarray(values, dtype=np.float64)
        if len(values) not in programs:
            programs[len(values)] = all_reduce_program("counts", [len(values)], "float64")
        main, counts = programs[len(values)]
        return np.asarray(exe.run(main, feed={"counts": values}, fetch_list=[counts])[0])

    return reduce
