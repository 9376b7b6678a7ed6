"""No collective op before its ring exists: the start of a 2-rank train.py (the command
schedulers restart, with --from-checkpoint auto), recorded program by program up to its
first training step (tests/ranks/recorded_start.py), must create each communicator ring
in a program (or, on CPU ranks, by gloo) that ran before the first op that uses it.

On GPUs ring 0's NCCL communicator is created by the startup program that Fleet's
``minimize`` writes; a collective of the start run before it (the ranks' agreement on
--from-checkpoint auto was one) fails on every GPU rank ("ring 0 has not been
initialized"). No GPU is here: on the GPU build of Paddle a recording executor stands in
for one (it records the real GPU programs Fleet builds and runs them on the CPU without
their NCCL ops). The same assertion holds on CPU ranks with real processes and gloo.
"""

import json

import pytest

from conftest import launch, ok, train_args


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


def recorded_start(fmnist_root, tmp_path, *flags, **env):
    out, logs = tmp_path / "job", tmp_path / "logs"
    args = train_args(fmnist_root, out, "--epochs", "1", "--from-checkpoint", "auto", *flags)
    args[0] = "tests/ranks/recorded_start.py"
    ok(launch(args, logs, env=dict(env, RECORD_DIR=str(tmp_path))))
    return [json.loads((tmp_path / f"record.{rank}.json").read_text()) for rank in (0, 1)]


def assert_rings_made_first(records):
    for rank, events in enumerate(records):
        assert events and events[-1]["step"], f"rank {rank} did not reach its first step"
        uses = [op for event in events for kind, *op in event["ops"] if kind == "uses"]
        assert uses, f"rank {rank}: no collective op recorded"
        assert rings_used_before_made(events) == [], (rank, events)


@pytest.mark.cuda_build
@pytest.mark.gpu_wheel
def test_gpu_ranks_create_ring_0_before_its_first_collective(fmnist_root, tmp_path):
    # (NVIDIA's CPU affinity reads nvidia-smi, which the stand-in has not)
    records = recorded_start(
        fmnist_root, tmp_path, "--enable-cpu-affinity", "False", STAND_IN_GPU="1"
    )
    assert_rings_made_first(records)
    # the GPU path: ring 0 made by NCCL ops of a program, not by gloo
    makers = {
        op for events in records for e in events for kind, op, _ in e["ops"] if kind == "makes"
    }
    assert "gloo" not in makers and makers & {"c_comm_init", "c_comm_init_all", "comm_init_all"}


@pytest.mark.cpu_only
def test_cpu_ranks_create_ring_0_before_its_first_collective(fmnist_root, tmp_path):
    assert_rings_made_first(recorded_start(fmnist_root, tmp_path))
