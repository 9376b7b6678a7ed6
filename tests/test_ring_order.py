"""No collective op before its ring exists, in every mode users launch: the start of a
2-rank train.py up to its first training step (or the end of its evaluation), recorded
program by program and call by call (tests/ranks/recorded_start.py), must create each
communicator ring (in a program, or by a call: gloo's, or NCCL's context on PIR) before
the first op that uses it.

On GPUs nothing but the toolkit makes ring 0 before the first collective: on the legacy
IR Fleet's ``minimize`` wrote NCCL's set-up into the startup program, which eval_only
never reaches; on PIR nothing made it at all (``pd_op.all_reduce_`` looks ring "0" up
in ``CommContextManager``). ``paddle_internals.make_ring0`` now makes it before any
program, in every mode. No GPU is here: a recording executor stands in for one (the GPU
build of Paddle for the legacy IR: Fleet's real NCCL ops; Paddle 3 for PIR: the call
that creates NCCL's context recorded in place of being made). The same assertion holds
on CPU ranks with real processes and gloo.

The matrix is {legacy, PIR} x {train_eval, train_only, eval_only, benchmark} x {a fresh
start, an ``auto`` resume from an epoch's and from a mid-epoch checkpoint} x {fp32, fp16
AMP, bf16 AMP}. The ring's order is decided by the code path of the IR and the scope; the
start and the precision change which programs run between the ring and the first step
(a resume's loading, AMP's found-inf all-reduce). One 2-rank launch per IR and scope
(8), each with a start and a precision of its own, so that every start and every
precision each IR builds is recorded on it (bf16 AMP is PIR's alone: the legacy IR
refuses it in one line; fp16 AMP cannot be built under PIR on a CPU build: its kernels'
dtypes are checked while the program is built). The resumes are in fp32,
from checkpoints of a real 1-rank run: a mid-epoch checkpoint resumes training only on
as many ranks as saved it, so the mid-epoch cells evaluate it (eval_only); a 2-rank
training resume from the middle of an epoch is not in the matrix.
"""

import json
import os
import shutil
import signal
import sys

import pytest

from conftest import PADDLE3, interrupted, launch, ok, train_args
from paddle_resnet.core import bootstrap, devices


def rings_used_before_made(events):
    """[(program index, op, ring)] of each collective op whose ring no earlier op made."""
    made, early = set(), []
    for event in events:
        for kind, op, ring in event["ops"]:
            if kind == "makes":
                made.add(ring)
            elif ring not in made:
                early.append((event["program"], op, ring))
    return early


def recorded_start(fmnist_root, tmp_path, *flags, auto=True, epochs=1, **env):
    """Each rank's record of a 2-rank start of an ``epochs``-epoch run with ``flags``
    (``auto``: the command that schedulers restart, --from-checkpoint auto)."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    start = ["--from-checkpoint", "auto"] if auto else []
    args = train_args(fmnist_root, out, "--epochs", str(epochs), *start, *flags)
    args[0] = "tests/ranks/recorded_start.py"
    ok(launch(args, logs, env=dict(env, RECORD_DIR=str(tmp_path))))
    return [json.loads((tmp_path / f"record.{rank}.json").read_text()) for rank in (0, 1)]


def assert_rings_made_first(records, steps=True):
    for rank, events in enumerate(records):
        if steps:
            assert events and events[-1]["step"], f"rank {rank} did not reach its first step"
        uses = [op for event in events for kind, *op in event["ops"] if kind == "uses"]
        assert uses, f"rank {rank}: no collective op recorded"
        assert rings_used_before_made(events) == [], (rank, events)


def makers(records):
    return {op for events in records for e in events for kind, op, _ in e["ops"] if kind == "makes"}


def test_the_check_fails_on_a_collective_before_its_ring():
    """The check itself (it must be able to fail): a collective of program 0 before ring 0
    is made, a use of another ring than the one made, and the right order."""
    use = {"program": 0, "ops": [["uses", "c_allreduce_sum", 0]], "step": False}
    make = {"program": None, "ops": [["makes", "gloo", 0]], "step": False}
    other = {"program": 1, "ops": [["uses", "all_reduce", 1]], "step": True}
    assert rings_used_before_made([use, make]) == [(0, "c_allreduce_sum", 0)]
    assert rings_used_before_made([make, other]) == [(1, "all_reduce", 1)]
    assert rings_used_before_made([make, use]) == []


@pytest.mark.cuda_build
@pytest.mark.gpu_wheel
def test_gpu_ranks_create_ring_0_before_its_first_collective(fmnist_root, tmp_path):
    # (NVIDIA's CPU affinity reads nvidia-smi, which the stand-in has not)
    records = recorded_start(
        fmnist_root, tmp_path, "--enable-cpu-affinity", "False", STAND_IN_GPU="1"
    )
    assert_rings_made_first(records)
    # the GPU path: ring 0 made by NCCL ops of a program, not by gloo
    assert "gloo" not in makers(records)
    assert makers(records) & {"c_comm_init", "c_comm_init_all", "comm_init_all"}


@pytest.mark.cpu_only
def test_cpu_ranks_create_ring_0_before_its_first_collective(fmnist_root, tmp_path):
    records = recorded_start(fmnist_root, tmp_path)
    assert_rings_made_first(records)
    assert makers(records) == {"gloo"}


PRECISIONS = {
    "fp32": (),
    "fp16": ("--amp", "--amp-dtype", "float16", "--use-dynamic-loss-scaling"),
    "bf16": ("--amp", "--amp-dtype", "bfloat16"),
}
# (IR, --run-scope, start, precision): each IR with every scope once, every start and every
# precision its stand-in can build at least once
CELLS = [
    ("legacy", "train_eval", "fresh", "fp16"),
    ("legacy", "train_only", "epoch", "fp32"),
    ("legacy", "eval_only", "mid-epoch", "fp32"),
    ("legacy", "benchmark", "fresh", "fp32"),
    ("pir", "train_eval", "epoch", "fp32"),
    ("pir", "train_only", "fresh", "bf16"),
    ("pir", "eval_only", "mid-epoch", "fp32"),
    ("pir", "benchmark", "fresh", "fp32"),
]
STEPS_PER_EPOCH = 10  # train_args: 160 images, batch 16


@pytest.fixture(scope="module")
def checkpoints(fmnist_root, tmp_path_factory):
    """{(IR, start): the checkpoint a start of that kind resumes from}: a real 1-rank run
    of the cells' 2-epoch recipe on each IR (fp32: the resumes' precision), stopped by
    SIGTERM after its 3rd step (saved there), then again in its 2nd epoch (after the 1st
    epoch's checkpoint)."""
    found = {}
    for ir_name in ("legacy", "pir"):
        if not available(ir_name):
            continue
        out = tmp_path_factory.mktemp(f"checkpoints-{ir_name}")
        args = train_args(fmnist_root, out, "--epochs", "2", "--ir", ir_name)
        command = [sys.executable, *args, "--from-checkpoint", "auto"]
        kept = tmp_path_factory.mktemp(f"mid-epoch-{ir_name}")
        for step in (3, STEPS_PER_EPOCH + 2):
            code, output = interrupted(command, signal.SIGTERM, step)
            assert code == 143, output[-3000:]
            if step == 3:
                mid = shutil.copytree(out / "resnet18" / "1-step3", kept / "1-step3")
        found[(ir_name, "epoch")], found[(ir_name, "mid-epoch")] = out / "resnet18" / "1", mid
    return found


def available(ir_name):
    """Whether this Paddle has the cell's stand-in GPU: the legacy IR's on the GPU build of
    2.6, PIR's on Paddle 3 (not in the PIR-only rehearsal's legacy cells)."""
    if ir_name == "pir":
        return PADDLE3
    return devices.cuda_build() and not bootstrap.pir_only()


@pytest.mark.parametrize(
    "cell",
    [
        # the legacy cells on the GPU build (track 2), PIR's on Paddle 3 (track 3)
        pytest.param(cell, marks=[pytest.mark.cuda_build] if cell[0] == "legacy" else [])
        for cell in CELLS
    ],
    ids=["-".join(cell) for cell in CELLS],
)
def test_every_mode_creates_ring_0_before_its_first_collective(
    fmnist_root, tmp_path, checkpoints, cell
):
    """One cell of the matrix (module docstring) on 2 stand-in GPU ranks: ring 0 made (by
    NCCL's ops or NCCL's call, never gloo) before the first collective, up to the first
    training step or the end of the evaluation."""
    ir_name, scope, start, precision = cell
    if not available(ir_name):
        pytest.skip(f"no stand-in GPU for the {ir_name} IR on {devices.build_name()}")
    flags = ["--ir", ir_name, "--run-scope", scope, *PRECISIONS[precision]]
    flags += ["--enable-cpu-affinity", "False"]
    if scope == "benchmark":
        flags = ["--ir", ir_name, "--benchmark", *PRECISIONS[precision]]
        flags += ["--enable-cpu-affinity", "False"]
    if start != "fresh":
        source = checkpoints[(ir_name, start)]
        os.makedirs(tmp_path / "job" / "resnet18")
        shutil.copytree(source, tmp_path / "job" / "resnet18" / os.path.basename(source))
    # eval_only from scratch evaluates the initial weights (auto would refuse no checkpoint)
    auto = not (scope == "eval_only" and start == "fresh")
    records = recorded_start(fmnist_root, tmp_path, *flags, auto=auto, epochs=2, STAND_IN_GPU="1")
    assert_rings_made_first(records, steps=scope != "eval_only")
    assert "gloo" not in makers(records)
    expected = {"create_nccl_comm_context"} if ir_name == "pir" else {"c_comm_init"}
    assert makers(records) & expected, makers(records)
