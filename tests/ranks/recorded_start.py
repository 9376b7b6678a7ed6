"""One rank of train.py whose start is recorded: every program the run hands to an
executor, in order, with the rings its ops create and the rings its collective ops use,
up to the first training step, written to RECORD_DIR/record.<rank>.json; the rank then
ends (status 0).

    python -m paddle.distributed.launch --nproc_per_node 2 tests/ranks/recorded_start.py \\
        <train.py's flags>

With STAND_IN_GPU=1 the rank takes the GPU path and a recording executor stands in for
the GPU: it runs each program on the CPU without its ring-creating ops, answers a
collective program with its own feed (a sum over one rank) and stops at the first
training step (or at the end of an evaluation). On the legacy IR that is the GPU build
of Paddle on a machine without a GPU (Fleet's NCCL ops, ``c_gen_nccl_id`` and
``c_comm_init``, are real there); on PIR, any Paddle 3: the call that creates NCCL's
communicator (``paddle_internals.make_ring0``'s ``create_nccl_comm_context``) is recorded
in place of being made. Without it the rank runs on the CPU for real (gloo's ring, made
before any program: recorded as made by gloo) and stops after its first training step.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import json
import os
import sys
import time

import paddle

from paddle_resnet.commands import train
from paddle_resnet.core import devices, paddle_internals
from paddle_resnet.training import session

# Ops that create a communicator ring (their ring_id attribute, default 0): Fleet's NCCL
# set-up on Paddle 2.6 and 3.x, BKCL's on XPUs.
RING_MAKERS = (
    "c_gen_nccl_id",
    "c_comm_init",
    "c_comm_init_all",
    "comm_init_all",
    "c_comm_init_multitrainer",
    "c_gen_bkcl_id",
)
COLLECTIVES = ("c_allreduce_sum", "all_reduce", "c_broadcast", "broadcast", "c_allgather")
RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
STAND_IN_GPU = os.environ.get("STAND_IN_GPU") == "1"
EVENTS = []


def ring_of(op):
    return int(op.attr("ring_id")) if op.has_attr("ring_id") else 0


def write_record():
    path = os.path.join(os.environ["RECORD_DIR"], f"record.{RANK}.json")
    with open(path, "w") as handle:
        json.dump(EVENTS, handle)


def end_at_the_first_step():
    """Record and end this rank. Rank 0 serves the job's key-value store, which a rank
    still leaving the start's last agreement polls: it ends once every rank has recorded
    (at most 2 minutes), as a training rank 0 would still be running then."""
    write_record()
    if RANK == 0:
        records = [
            os.path.join(os.environ["RECORD_DIR"], f"record.{rank}.json")
            for rank in range(int(os.environ.get("PADDLE_TRAINERS_NUM", "1")))
        ]
        until = time.monotonic() + 120
        while not all(map(os.path.exists, records)) and time.monotonic() < until:
            time.sleep(0.1)
    os._exit(0)


def op_name(op):
    """A legacy op's type, or a PIR op's name without its dialect and in-place mark
    ("pd_op.all_reduce_" -> "all_reduce")."""
    if isinstance(getattr(op, "type", None), str):
        return op.type
    return op.name().split(".")[-1].rstrip("_")


def pir_ring_of(op):
    return int(op.attrs().get("ring_id", 0))


def describe(program):
    """The program's ring makers and collectives in op order: [[kind, op type, ring]]."""
    pir = paddle_internals.is_pir_program(program)
    ops = []
    for op in program.global_block().ops:
        name, ring = op_name(op), (pir_ring_of if pir else ring_of)
        if name in RING_MAKERS:
            ops.append(["makes", name, ring(op)])
        elif name in COLLECTIVES:
            ops.append(["uses", name, ring(op)])
    return ops


def is_training_step(program):
    return any(op_name(op).endswith("_grad") for op in program.global_block().ops)


RealExecutor = paddle.static.Executor


class RecordingExecutor:
    """paddle.static.Executor's ``run`` over the CPU, recording each program first."""

    def __init__(self, place=None):
        self.cpu = RealExecutor(paddle.CPUPlace())

    def run(self, program=None, feed=None, fetch_list=None, **kwargs):
        program = program or paddle.static.default_main_program()
        # a CompiledProgram (the GPU path's evaluation): its program, run on the CPU
        program = getattr(program, "_program", program)
        ops = describe(program)
        EVENTS.append({"program": len(EVENTS), "ops": ops, "step": is_training_step(program)})
        if is_training_step(program) and STAND_IN_GPU:
            end_at_the_first_step()
        if STAND_IN_GPU and any(kind == "uses" for kind, _, _ in ops):
            # a collective of the start: the sum over this one rank
            names = [getattr(f, "name", f) for f in fetch_list or []]
            return [feed[name] for name in names]
        if STAND_IN_GPU and any(kind == "makes" for kind, _, _ in ops):
            program = program.clone()
            paddle_internals.remove_ops(program, RING_MAKERS)
        results = self.cpu.run(program, feed=feed, fetch_list=fetch_list, **kwargs)
        if is_training_step(program):
            end_at_the_first_step()
        return results

    def close(self):
        self.cpu.close()


def loader_on_the_cpu(make_loader):
    """DALI's pipelines on the CPU: the stand-in GPU decodes nothing."""

    def make(*args):
        return make_loader(*args[:7], None, *args[8:])

    return make


def recorded_ring0(make):
    """``paddle_internals.make_ring0`` that records the ring made by a call (gloo's; NCCL's
    context on PIR, recorded but not made on the stand-in); the legacy GPU path's ring is
    made by a program, which the recording executor records."""

    def recorded(rank, endpoints, place, device_id):
        if STAND_IN_GPU and paddle_internals.pir_active():
            how = "create_nccl_comm_context"
        else:
            how = make(rank, endpoints, place, device_id)
        if how != "nccl-program":
            EVENTS.append({"program": None, "ops": [["makes", how, 0]], "step": False})
        return how

    return recorded


if __name__ == "__main__":
    paddle.static.Executor = RecordingExecutor
    paddle_internals.make_ring0 = recorded_ring0(paddle_internals.make_ring0)
    if STAND_IN_GPU:
        paddle.device.cuda.device_count = lambda: 1
        devices.gpu_count = lambda: 1  # on Paddle 3's CPU build too (PIR's stand-in)
        devices.device = lambda: (paddle.CPUPlace(), 0)
        devices.describe = lambda device_id: f"GPU {device_id} (a recording stand-in)"
        session.make_loader = loader_on_the_cpu(session.make_loader)
    status = train.main(sys.argv[1:])
    write_record()  # a start that ended before its first step
    sys.exit(status)
