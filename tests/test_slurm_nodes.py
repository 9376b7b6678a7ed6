"""train_multinode.sbatch on two Slurm nodes (two slurmd on this host: tests/slurm_cluster.py),
one launcher and one CPU rank per node: a refusal on one rank is the job's status on every
node, the job ends FAILED within the start's deadline with the refusal's line, and is not
requeued (where one rank used to die in gloo's TIMEOUT traceback, and srun's highest status
could hide a node's 2 behind another's 75)."""

import json
import time

import pytest
import slurm_cluster
from test_slurm import ENDED, MULTI, read, submit

from conftest import once, train_command
from paddle_resnet.core.errors import USER_ERROR

# the batch scripts are Paddle-independent, as test_slurm.py: run once
pytestmark = [pytest.mark.cpu_only, once]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    try:
        with slurm_cluster.running(tmp_path_factory.mktemp("slurm2"), nodes=2) as cluster:
            yield cluster
    except slurm_cluster.Unavailable as reason:
        pytest.skip(f"no Slurm to test with: {reason}")


def test_a_refusal_of_rank_0_fails_the_two_node_job_in_bounded_time(
    two_nodes, fmnist_root, tmp_path
):
    """Every checkpoint of the run damaged: rank 0 (node n1) refuses --from-checkpoint auto,
    rank 1 (node n2), waiting for its choice in the job's store, ends with the same status
    and line; both launchers exit 2 and the script ends the job FAILED, not requeued."""
    out, log, ranks = tmp_path / "out", tmp_path / "job.log", tmp_path / "ranks"
    damaged = out / "resnet18" / "1"
    damaged.mkdir(parents=True)
    (damaged / "model.pdparams").write_bytes(b"junk")  # not the bytes meta.json lists
    entry = {"bytes": 4, "sha256": "0" * 64}
    (damaged / "meta.json").write_text(json.dumps({"epoch": 1, "files": {"model.pdparams": entry}}))
    args = [*train_command(fmnist_root, out)[3:], "--start-timeout", "120"]
    began = time.monotonic()
    job = submit(
        two_nodes,
        MULTI,
        log,
        *args,
        options=["--nodes=2"],
        MASTER_ADDR="127.0.0.1",  # the nodes' names n1, n2 do not resolve
        LAUNCH_LOG_DIR=str(ranks),
    )
    fields = two_nodes.wait_state(job, ENDED, timeout=240)
    seconds = time.monotonic() - began
    output = read(log)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == f"{USER_ERROR}:0", (
        fields,
        output[-3000:],
        two_nodes.log(),
    )
    assert fields["Restarts"] == "0"
    assert seconds < 120 + 60
    rank0, rank1 = (read(ranks / f"node{n}" / "workerlog.0") for n in (0, 1))
    refusal = rank0.strip().splitlines()[-1]
    assert refusal.startswith("error: --from-checkpoint auto: every checkpoint in"), rank0
    assert f"error: rank 1: rank 0 ended the start ({refusal.removeprefix('error: ')})" in rank1
    assert "Traceback" not in rank0 + rank1 + output
    assert [read(ranks / f"node{n}.status").strip() for n in (0, 1)] == ["2", "2"]
    assert output.strip().splitlines()[-1] == (
        "train_multinode.sbatch: training failed with exit status 2 (input that no restart "
        "can fix): not requeued"
    )
