"""The addresses train_multinode.sbatch gives Paddle's launcher (scripts/cluster/slurm/
node_address.py), fast and without Slurm: the batch script itself run with stand-ins for
srun, scontrol and the launcher on a two-node job whose first node's name maps to a
loopback address (as Debian's /etc/hosts maps the host name to 127.0.1.1), and the
helper's choice with faked name lookups and routes: a loopback address is refused in one
line with exit status 2, MASTER_ADDR is honoured."""

import importlib.util
import ipaddress
import os
import subprocess
import sys

import pytest
from paddle.distributed.launch.context.args_envs import parse_args

from conftest import ROOT

SLURM_SCRIPTS = os.path.join(ROOT, "scripts", "cluster", "slurm")
MULTI = os.path.join(SLURM_SCRIPTS, "train_multinode.sbatch")
USER_ERROR = 2

spec = importlib.util.spec_from_file_location(
    "node_address", os.path.join(SLURM_SCRIPTS, "node_address.py")
)
node_address = importlib.util.module_from_spec(spec)
spec.loader.exec_module(node_address)


def routable_address_here():
    source = node_address.route_source(node_address.DEFAULT_ROUTE_PROBE)
    if not source or ipaddress.ip_address(source).is_loopback:
        pytest.skip("this machine has no routable IPv4 address (no default route)")
    return source


def executable(path, text):
    path.write_text(text)
    path.chmod(0o755)


def run_multinode_job(tmp_path, nodes, monkeypatch, **env):
    """train_multinode.sbatch on a job of ``nodes`` (names) where srun runs each node's
    task here in turn (SLURM_NODEID 0, 1, ...) and the launcher is a stand-in that records
    its arguments: (the script's result, {node rank: the launcher's parsed args})."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(
        bin_dir / "scontrol",
        '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && echo "$3" | tr , "\\n"\n',
    )
    executable(
        bin_dir / "srun",
        "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nstatus=0\n"
        'for ((node = 0; node < SLURM_NNODES; node++)); do SLURM_NODEID=$node "$@" || status=$?; done\n'
        'exit "$status"\n',
    )
    # the launcher records its arguments; anything else (job_progress, the helper) is Python
    executable(
        bin_dir / "python",
        '#!/bin/sh\nif [ "$1 $2" = "-m paddle.distributed.launch" ]; then\n'
        f'  shift 2; printf "%s\\n" "$@" > {tmp_path}/launch.$SLURM_NODEID; exit 0\nfi\n'
        f'exec {sys.executable} "$@"\n',
    )
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(("SLURM", "MASTER"))
    }
    environment.update(
        PATH=f"{bin_dir}:{environment['PATH']}",
        PYTHON=str(bin_dir / "python"),
        NPROC_PER_NODE="1",
        LAUNCH_LOG_DIR=str(tmp_path / "log"),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST=",".join(nodes),
        SLURM_NNODES=str(len(nodes)),
        **env,
    )
    done = subprocess.run(
        ["bash", MULTI, "--config", "resnet18_demo", "--image-root", str(tmp_path)]
        + ["--output-dir", str(tmp_path / "out")],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    launched = {}
    for rank in range(len(nodes)):
        record = tmp_path / f"launch.{rank}"
        if record.exists():
            monkeypatch.setattr(sys, "argv", ["launch", *record.read_text().splitlines()])
            launched[rank], _ = parse_args()
    return done, launched


def test_each_node_passes_a_routable_address_and_the_master_knows_itself(tmp_path, monkeypatch):
    """localhost stands for a first node whose name maps to loopback: the old script gave
    the launchers --master 127.0.0.1 (its gethostbyname(getfqdn())) and no --host, so
    every node's launcher took the rendezvous for its own."""
    here = routable_address_here()
    done, launched = run_multinode_job(tmp_path, ["localhost", "n2-unresolved"], monkeypatch)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(launched) == {0, 1}, done.stdout + done.stderr
    master_ip = launched[0].master.split(":")[0]
    assert master_ip == here  # this host's address on its default route
    for rank, args in launched.items():
        assert args.master == f"{here}:{20000 + 4242}", rank
        assert not ipaddress.ip_address(args.host).is_loopback, rank
    # the launcher starts the rendezvous where --master's IP is its --host (master.py)
    assert launched[0].host == master_ip
    assert launched[1].host == node_address.route_source(master_ip)


def test_master_addr_is_honoured(tmp_path, monkeypatch):
    routable_address_here()  # node 1 needs a route to it
    done, launched = run_multinode_job(
        tmp_path, ["n1-unresolved", "n2-unresolved"], monkeypatch, MASTER_ADDR="10.11.12.13"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert launched[0].master == f"10.11.12.13:{20000 + 4242}"
    assert launched[0].host == "10.11.12.13"  # rank 0 is the master: the same string
    assert launched[1].host == node_address.route_source("10.11.12.13")
    assert node_address.main(["master", "10.11.12.13", "n1", "n2"]) == 0


def only_loopback(monkeypatch):
    """A node whose name maps to 127.0.1.1 and that has no route anywhere else."""
    monkeypatch.setattr(node_address, "resolve", lambda name: ["127.0.1.1"])
    monkeypatch.setattr(node_address, "route_source", lambda destination: None)


def test_a_loopback_master_is_refused_in_one_line(monkeypatch, capsys):
    only_loopback(monkeypatch)
    assert node_address.main(["master", "", "n1", "n2"]) == USER_ERROR
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("train_multinode.sbatch: the first node n1 resolves to 127.0.1.1")
    assert "set MASTER_ADDR" in line and "interface" in line
    # a job of one node: nothing else must reach it
    assert node_address.main(["master", "", "n1"]) == 0
    assert capsys.readouterr().out == "127.0.1.1\n"


def test_a_loopback_route_to_the_master_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(node_address, "route_source", lambda destination: "127.0.0.1")
    assert node_address.main(["host", "10.11.12.13", "1"]) == USER_ERROR
    (line,) = capsys.readouterr().err.splitlines()
    assert "node 1 reaches the master 10.11.12.13 only from the loopback address" in line
    monkeypatch.setattr(node_address, "route_source", lambda destination: None)
    assert node_address.main(["host", "10.11.12.13", "1"]) == USER_ERROR
    assert "no route to the master" in capsys.readouterr().err


def test_the_first_node_found_through_the_route_to_another(monkeypatch, capsys):
    """The name maps to loopback here, another node's does not: the source address on the
    route to it, before the default route's."""
    monkeypatch.setattr(
        node_address, "resolve", lambda name: {"n1": ["127.0.1.1"], "n2": ["10.0.0.6"]}[name]
    )
    routes = {"10.0.0.6": "10.0.0.5", node_address.DEFAULT_ROUTE_PROBE: "192.168.1.5"}
    monkeypatch.setattr(node_address, "route_source", routes.get)
    assert node_address.main(["master", "", "n1", "n2"]) == 0
    assert capsys.readouterr().out == "10.0.0.5\n"


def test_a_refused_node_fails_the_job_with_status_2(tmp_path, monkeypatch):
    """MASTER_ADDR that does not resolve: the batch script stops before any srun, exit 2,
    the helper's line in its output."""
    done, launched = run_multinode_job(
        tmp_path, ["n1", "n2"], monkeypatch, MASTER_ADDR="no-such-host.invalid"
    )
    assert done.returncode == USER_ERROR and launched == {}
    assert (
        "train_multinode.sbatch: MASTER_ADDR=no-such-host.invalid does not resolve" in done.stderr
    )
