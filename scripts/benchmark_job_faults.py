"""Faults of a multi-rank job on one host, 2 to 16 gloo ranks of the real launcher: the time
to the first step, then how long every rank and the launcher take to end after one rank
fails, the launcher's status and each rank's last ``error:`` line.

    .venv/bin/python scripts/benchmark_job_faults.py --at HEAD --output benchmarks/job_faults.json

Each size N (``--ranks``, default 2,4,8,16) runs ``python -m paddle.distributed.launch
--nproc_per_node N --log_dir D train.py`` (ResNet-18 at 32 px, batch 16 per rank, one DALI
thread, OMP_NUM_THREADS=1 per rank, ``--print-interval 1``) on a Fashion-MNIST JPEG tree
(``--image-root``, or one written as tests/conftest.py's ``fmnist_root`` is, with
``--train-per-class`` images a class: 1,600 give 16 ranks 6 steps an epoch) three times:

  kill-last   many epochs; once rank 0 has logged step 2 (every rank has been through
              step 1's all-reduce), the last rank gets SIGKILL;
  refuse      tests/ranks/start_fault.py with START_FAULT=refuse:PHASE:LAST: the last rank
              refuses its start at ``--refusal-phase`` (default ``weights``, after the
              programs made the rings);
  kill-store  as kill-last, but rank 0 (which serves the job's TCP store) is SIGKILLed.

Only rank 0 prints (core/report.py), so "the first step on every rank" is rank 0's first
``[LOG] epoch 1 step 1`` line in ``D/workerlog.0``: a synchronous data-parallel step ends on
rank 0 only once every rank's gradients have been all-reduced. The ranks are the
processes whose environment holds this run's mark and PADDLE_TRAINER_ID (their
``core/rank_guard.py`` watchers, in their own session, are counted apart). The fault's
moment: the SIGKILL, or for a refusal the first poll (every 0.1 s) that finds the
refusing rank's ``error:`` line or the rank gone. A case whose processes have not all
ended ``--end-limit`` s after the fault (``--start-limit`` s after the launch, before it)
is recorded as did-not-end and its processes are SIGKILLed. The goal checked: every rank
ends within 30 s of the fault, each surviving rank with a last ``error:`` line naming the
failed rank. ``--at REF`` measures that commit's code (``git archive`` into a temporary
folder, as the working tree of this checkout may hold others' unfinished edits); without
it, ``--code`` (default: this checkout) as it is, its modified files recorded. Figures are
written to ``--output`` under ``--label``.
"""

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.errors import exit_status
from paddle_resnet.data.fashion_mnist import write_tree

FLAGS = (
    "--model-arch-name resnet18 --num-of-class 10 --crop-size 32 --resize-short 32 "
    "--batch-size 16 --warmup-epochs 0 --dali-num-threads 1 --print-interval 1"
).split()
FAULTS = ("kill-last", "refuse", "kill-store")
GOAL_SECONDS = 30
POLL_SECONDS = 0.1
MARK = "PADDLE_RESNET_FAULTS_BENCHMARK"
STEP = re.compile(r"^\[LOG\] epoch (\d+) step (\d+):", re.M)


def cpu_model():
    found = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in found.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def read(path):
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def process(pid):
    """(state, environment, command line) of ``pid``, or None once it has ended (a zombie
    has ended: its parent has yet to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/environ", "rb") as environ:
            variables = b"\0" + environ.read()
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return None
    return None if state == "Z" else (state, variables, command)


def marked(mark):
    """{pid: (environment, command line)} of the live processes holding ``mark``."""
    needle = f"\0{MARK}={mark}\0".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            seen = process(int(entry))
            if seen and needle in seen[1] + b"\0":
                found[int(entry)] = seen[1:]
    return found


def rank_of(variables, command, script):
    """The rank a marked process is (None: the launcher, a watcher, or something else)."""
    found = re.search(rb"\0PADDLE_TRAINER_ID=(\d+)\0", variables + b"\0")
    if not found or script not in command or "rank_guard.py" in command:
        return None
    return int(found.group(1))


def last_error(text):
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("error:")]
    return lines[-1] if lines else None


def names(line, failed, rank):
    """Whether ``line`` (rank ``rank``'s) names rank ``failed``, its own prefix aside."""
    if line is None:
        return False
    body = line.removeprefix("error:").strip()
    if rank != failed:
        body = body.removeprefix(f"rank {rank}:")
    return re.search(rf"\brank {failed}\b", body) is not None


def kill_all(mark, job):
    """SIGKILL to the launcher's process group and to every process holding ``mark``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job.pid, signal.SIGKILL)
    for pid in marked(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.wait()


def run_case(args, code, image_root, ranks, fault):
    work = tempfile.mkdtemp(prefix=f"job_faults_{ranks}_{fault}_")
    logs, out = os.path.join(work, "logs"), os.path.join(work, "out")
    failed = 0 if fault == "kill-store" else ranks - 1
    mark = f"{os.getpid()}-{ranks}-{fault}-{time.time_ns()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=code, **{MARK: mark})
    env.pop("START_FAULT", None)
    script, epochs = "train.py", "500"
    if fault == "refuse":
        script, epochs = "tests/ranks/start_fault.py", "1"
        env["START_FAULT"] = f"refuse:{args.refusal_phase}:{failed}"
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node"]
    command += [str(ranks), "--log_dir", logs, script, *FLAGS, "--epochs", epochs]
    command += ["--image-root", image_root, "--output-dir", out]
    launcher_log = open(os.path.join(work, "launcher.txt"), "w")
    began = time.monotonic()
    job = subprocess.Popen(
        command,
        cwd=code,
        env=env,
        stdout=launcher_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pids, ended, watchers = {}, {}, set()
    first_step = fault_at = None
    row = {"ranks": ranks, "fault": fault, "failed_rank": failed}
    try:
        while True:
            now = time.monotonic()
            if len(pids) < ranks or fault_at is None:
                for pid, (variables, line) in marked(mark).items():
                    rank = rank_of(variables, line, os.path.basename(script))
                    if rank is not None and pid != job.pid:
                        pids.setdefault(rank, pid)
                    elif "rank_guard.py" in line:
                        watchers.add(pid)
            rank0 = read(os.path.join(logs, "workerlog.0"))
            steps = STEP.findall(rank0)
            if first_step is None and steps:
                first_step = now - began
            if fault_at is None and fault != "refuse" and len(steps) >= 2 and len(pids) == ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pids[failed], signal.SIGKILL)
                fault_at = time.monotonic()
                row["killed_after_steps_logged"] = len(steps)
            if fault_at is None and fault == "refuse":
                victim = read(os.path.join(logs, f"workerlog.{failed}"))
                gone = failed in pids and process(pids[failed]) is None
                if last_error(victim) or gone:
                    fault_at = now
            for rank, pid in pids.items():
                if rank not in ended and process(pid) is None:
                    ended[rank] = now
            if "launcher" not in ended and job.poll() is not None:
                ended["launcher"] = now
            if "launcher" in ended and all(rank in ended for rank in pids):
                break
            since, limit = (fault_at, args.end_limit) if fault_at else (began, args.start_limit)
            if now - since > limit:
                row["did_not_end"] = sorted(
                    (str(k) for k in list(pids) + ["launcher"] if k not in ended), key=str
                )
                break
            time.sleep(POLL_SECONDS)
        row["ranks_seen"] = len(pids)
        row["first_step_seconds"] = None if first_step is None else round(first_step, 1)
        if fault_at is None:
            row["fault_never_happened"] = True
        else:
            row["fault_at_seconds"] = round(fault_at - began, 1)
            row["seconds_until_all_ended"] = (
                None if "did_not_end" in row else round(max(ended.values()) - fault_at, 1)
            )
            row["seconds_until_ended"] = {
                str(k): round(max(0.0, t - fault_at), 1) for k, t in sorted(ended.items(), key=str)
            }
        row["launcher_status"] = job.poll()
        row["watchers_alive_at_end"] = sum(process(pid) is not None for pid in watchers)
        lines = {r: last_error(read(os.path.join(logs, f"workerlog.{r}"))) for r in range(ranks)}
        row["last_error_lines"] = {str(r): line for r, line in lines.items()}
        survivors = [r for r in range(ranks) if not (r == failed and fault != "refuse")]
        row["every_line_names_failed"] = all(names(lines[r], failed, r) for r in survivors)
        row["launcher_last_lines"] = read(os.path.join(work, "launcher.txt")).splitlines()[-3:]
        total = row.get("seconds_until_all_ended")
        row["goal_met"] = bool(
            total is not None and total <= GOAL_SECONDS and row["every_line_names_failed"]
        )
    finally:
        kill_all(mark, job)
        launcher_log.close()
        if args.keep_logs:
            row["work"] = work
        else:
            shutil.rmtree(work, ignore_errors=True)
    return row


def code_at(ref, repository):
    """A temporary folder holding commit ``ref``'s files, and that commit's id."""
    commit = subprocess.run(
        ["git", "-C", repository, "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    folder = tempfile.mkdtemp(prefix=f"job_faults_code_{commit[:7]}_")
    archive = subprocess.Popen(["git", "-C", repository, "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", folder], stdin=archive.stdout, check=True)
    archive.wait()
    return folder, commit


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4,8,16")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--image-root", help="a Fashion-MNIST JPEG tree (written if absent)")
    parser.add_argument("--train-per-class", type=int, default=160)
    parser.add_argument("--at", help="measure this commit's code (git archive), not a checkout")
    parser.add_argument("--code", default=os.getcwd(), help="the checkout whose train.py runs")
    parser.add_argument("--refusal-phase", default="weights")
    parser.add_argument("--end-limit", type=float, default=180.0)
    parser.add_argument("--start-limit", type=float, default=600.0)
    parser.add_argument("--label", default="faults")
    parser.add_argument("--output", default="benchmarks/job_faults.json")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()

    def measure():
        repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if args.at:
            code, commit = code_at(args.at, repository)
            modified = []
        else:
            code = os.path.abspath(args.code)
            commit = subprocess.run(
                ["git", "-C", code, "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            modified = subprocess.run(
                ["git", "-C", code, "status", "--porcelain", "--", "paddle_resnet", "train.py"],
                capture_output=True,
                text=True,
            ).stdout.split("\n")
        image_root = args.image_root or os.path.join(tempfile.gettempdir(), "job_faults_fmnist")
        write_tree(image_root, args.train_per_class, 13, log=lambda _: None)
        load_before, rows = os.getloadavg()[0], []
        try:
            for ranks in (int(n) for n in args.ranks.split(",")):
                for fault in args.faults.split(","):
                    rows.append(run_case(args, code, image_root, ranks, fault))
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            if args.at:
                shutil.rmtree(code, ignore_errors=True)
        results = {}
        if os.path.exists(args.output):
            with open(args.output) as handle:
                results = json.load(handle)
        results[args.label] = {
            "code": args.at or code,
            "commit": commit,
            "modified_files": [line.strip() for line in modified if line.strip()],
            "command": " ".join(["scripts/benchmark_job_faults.py", *sys.argv[1:]]),
            "rows": rows,
            "machine": f"{cpu_model()}, {available_cores()} cores",
            "goal": f"every rank ends within {GOAL_SECONDS} s of the fault, each surviving "
            "rank's last error: line naming the failed rank",
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            "date": time.strftime("%Y-%m-%d"),
        }
        with open(args.output, "w") as handle:
            json.dump(results, handle, indent=1)

    return exit_status(measure)


if __name__ == "__main__":
    sys.exit(main())
