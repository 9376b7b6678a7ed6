"""A real Slurm on this host for the tests of scripts/cluster/slurm: a private munged (its
own key and socket), slurmctld and one slurmd whose configuration, state, logs and pid
files all live in one temporary folder, on ports of their own; a system Slurm or munged
is left alone. Needs root and Debian's slurm-wlm and munge (scripts/setup_slurm.sh); where
they are missing, or a daemon does not come up, ``running`` raises ``Unavailable`` with a
one-line reason (the tests skip with it)."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time

# The daemons are in /usr/sbin, which a non-login PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")


class Unavailable(Exception):
    """Slurm cannot run here; the message says why, in one line."""


def free_port():
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def write_conf(folder, host, cpus, munge_socket, nodes=1):
    """The minimal slurm.conf of docs/guide.md ("Slurm on one host, as the tests run it"),
    every path inside ``folder``. One node, the host itself; or ``nodes`` > 1 nodes named
    n1, n2, ... on this one host (docs/guide.md: "Two slurmd on one host"), each with one
    CPU and a slurmd port of its own. Returns (the file, the node names)."""
    if nodes == 1:
        names = [host]
        node_lines = [f"NodeName={host} CPUs={cpus} RealMemory=4000"]
        daemon_lines = [
            f"SlurmdPort={free_port()}",
            f"SlurmdSpoolDir={folder}/spool",
            f"SlurmdPidFile={folder}/slurmd.pid",
            f"SlurmdLogFile={folder}/slurmd.log",
        ]
    else:
        names = [f"n{index + 1}" for index in range(nodes)]
        node_lines = [
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 RealMemory=4000 "
            f"Port={free_port()}"
            for name in names
        ]
        daemon_lines = [
            f"SlurmdSpoolDir={folder}/spool/%n",
            f"SlurmdPidFile={folder}/slurmd.%n.pid",
            f"SlurmdLogFile={folder}/slurmd.%n.log",
        ]
    lines = [
        "ClusterName=pytest",
        f"SlurmctldHost={host}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"SlurmctldPort={free_port()}",
        *daemon_lines,
        f"StateSaveLocation={folder}/state",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "JobRequeue=1",
        "MpiDefault=none",
        *node_lines,
        f"PartitionName=main Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP",
    ]
    path = os.path.join(folder, "slurm.conf")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path, names


class Slurm:
    """Commands against the running cluster; every one gets SLURM_CONF=conf_path."""

    def __init__(self, folder, conf_path):
        self.folder = folder
        self.conf_path = conf_path
        self.env = dict(os.environ, SLURM_CONF=conf_path, PATH=SEARCH_PATH)

    def run(self, *argv, check=True, env=None):
        result = subprocess.run(
            list(argv),
            env=dict(self.env, **(env or {})),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr}")
        return result

    def sbatch(self, script, *args, options=(), env=None):
        """Submit ``script args``; ``options`` go to sbatch, ``env`` to the job (sbatch
        passes its environment on). The job id."""
        result = self.run("sbatch", "--parsable", *options, str(script), *args, env=env)
        return result.stdout.strip().split(";")[0]

    def job(self, jobid):
        """``scontrol show job``'s fields (JobState, Reason, Restarts, ExitCode, ...)."""
        out = self.run("scontrol", "--oneliner", "show", "job", str(jobid)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def state(self, jobid):
        return self.job(jobid)["JobState"]

    def requeue(self, jobid):
        self.run("scontrol", "requeue", str(jobid))

    def start_now(self, jobid):
        """A requeued job waits two minutes (Reason=BeginTime): start it now. Not within
        the second its previous run ended: slurmd refuses a job whose credential is no
        newer than the one it revoked when that run was killed ("Job credential revoked":
        the job ends FAILED, exit code 1)."""
        time.sleep(1.1)
        self.run("scontrol", "update", f"jobid={jobid}", "StartTime=now")

    def signal_batch(self, jobid, name):
        """``name`` (e.g. USR1) to the batch shell alone, as ``--signal=B:...`` sends it."""
        self.run("scancel", "--batch", f"--signal={name}", str(jobid))

    def wait_state(self, jobid, states, timeout=120):
        """Poll until the job's state is one of ``states``; its fields."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(jobid)
            if fields["JobState"] in states or time.monotonic() > deadline:
                return fields
            time.sleep(0.2)

    def log(self):
        """The daemons' logs, last lines (for a failing test's message)."""
        tails = []
        slurmds = sorted(
            n for n in os.listdir(self.folder) if n.startswith("slurmd") and n.endswith(".log")
        )
        for name in ("slurmctld.log", *slurmds):
            path = os.path.join(self.folder, name)
            if os.path.exists(path):
                with open(path) as handle:
                    tails.append(f"== {name}\n" + "".join(handle.readlines()[-20:]))
        return "\n".join(tails)


def wait_for(predicate, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def stop(pid_files, timeout=10):
    """End the daemons named by ``pid_files``, all at once: SIGTERM, then SIGKILL."""
    pids = []
    for pid_file in pid_files:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(pid_file) as handle:
                pids.append(int(handle.read().split()[0]))

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    for number in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)
        if wait_for(lambda: not any(alive(pid) for pid in pids), timeout):
            return


def tail(path, lines=3):
    try:
        with open(path) as handle:
            return " | ".join(line.strip() for line in handle.readlines()[-lines:])
    except OSError:
        return "(no log)"


def daemon(argv, env, what, log_path):
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        message = (result.stderr.strip() or tail(log_path)).replace("\n", " | ")
        raise Unavailable(f"{what} did not start (exit {result.returncode}): {message}")


@contextlib.contextmanager
def running(folder, nodes=1):
    """Start munged, slurmctld and one slurmd per node (``write_conf``) in ``folder``;
    yield a ``Slurm``; stop them."""
    if os.geteuid() != 0:
        raise Unavailable("a Slurm of its own needs root (slurmd runs the jobs as their user)")
    missing = [p for p in PROGRAMS if not shutil.which(p, path=SEARCH_PATH)]
    if missing:
        raise Unavailable(
            f"no {', '.join(missing)}: install slurm-wlm and munge (scripts/setup_slurm.sh)"
        )
    folder = os.path.abspath(str(folder))
    for sub in ("munge", "state", "spool", *(f"spool/n{i + 1}" for i in range(nodes))):
        os.makedirs(os.path.join(folder, sub), mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    munge = os.path.join(folder, "munge")
    key = os.path.join(munge, "munge.key")
    with open(key, "wb") as handle:
        handle.write(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = os.path.join(munge, "munge.socket")
    host = socket.gethostname().split(".")[0]
    conf, names = write_conf(folder, host, os.cpu_count() or 1, munge_socket, nodes)
    cluster = Slurm(folder, conf)
    slurmd_pids = ["slurmd.pid"] if nodes == 1 else [f"slurmd.{name}.pid" for name in names]
    pid_files = [
        os.path.join(folder, name) for name in (*slurmd_pids, "slurmctld.pid", "munge/munged.pid")
    ]
    try:
        # --force: as root munged refuses some ownerships of its folders otherwise
        daemon(
            [
                "munged",
                "--force",
                f"--key-file={key}",
                f"--socket={munge_socket}",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
            cluster.env,
            "munged",
            f"{munge}/munged.log",
        )
        daemon(["slurmctld", "-f", conf], cluster.env, "slurmctld", f"{folder}/slurmctld.log")
        for name in names:
            named = [] if nodes == 1 else ["-N", name]
            log = f"{folder}/slurmd.log" if nodes == 1 else f"{folder}/slurmd.{name}.log"
            daemon(["slurmd", "-f", conf, *named], cluster.env, "slurmd", log)

        def idle():
            result = cluster.run("sinfo", "--noheader", "--Node", "--format=%T", check=False)
            return result.stdout.split() == ["idle"] * nodes

        if not wait_for(idle, 30):
            state = cluster.run("sinfo", "--noheader", "--format=%T %E", check=False)
            raise Unavailable(
                f"the Slurm node did not become idle within 30 s (sinfo: "
                f"{(state.stdout + state.stderr).strip()}; slurmd log: "
                f"{tail(f'{folder}/slurmd.log', 2)})"
            )
        yield cluster
    finally:
        with contextlib.suppress(Exception):  # no job outlives its slurmd
            cluster.run("scancel", "--user=root", check=False)
            wait_for(lambda: not cluster.run("squeue", "--noheader", check=False).stdout, 40)
        stop(pid_files)
