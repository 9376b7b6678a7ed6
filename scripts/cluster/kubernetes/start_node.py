"""The entrypoint of a TrainJob's node (paddle-runtime.yaml, trainjob.yaml): restarts bounded
by progress, as the Slurm scripts bound their requeues (scripts/cluster/slurm/common.sh),
instead of JobSet's maxRestarts, which counts over the job's whole life (a run of weeks
that crashes now and then would reach any count while it progresses).

    python scripts/cluster/kubernetes/start_node.py -- python -m paddle.distributed.launch \\
        ... train.py TRAIN_FLAGS...

Node 0 (JOB_COMPLETION_INDEX 0, the rank that writes the checkpoints) keeps
<output-dir>/.k8s-starts-<JobSet uid> on the shared claim: how many starts in a row began
without a new checkpoint that verifies since the start before (python -m
paddle_resnet.commands.job_progress TRAIN_FLAGS: a staged or damaged checkpoint is none),
and that checkpoint. A start counts as one without progress from its beginning, so a start
that never reports (its pod evicted or preempted, its node lost, SIGKILL) counts too: a
crash, a stop and a disruption alike. Once MAX_STARTS_WITHOUT_PROGRESS (default 3) starts
in a row made none, the next start refuses in one line with exit status 2, which the node
Job's podFailurePolicy and the JobSet's failurePolicy take as fatal (FailJob, then
FailJobSet). The JobSet's uid (not its name) keys the file: a TrainJob submitted again
under the same name after such a refusal starts with a count of its own.

Then it execs the command, so the launcher stays PID 1 and gets the pod's SIGTERM. The
other nodes exec it at once: they follow node 0 (a JobSet restart recreates every pod)."""

import json
import os
import subprocess
import sys

from paddle_resnet.core.errors import RESTARTABLE, USER_ERROR

MAX_STARTS_VARIABLE = "MAX_STARTS_WITHOUT_PROGRESS"
DEFAULT_MAX_STARTS = 3
NAME = "start_node.py"


def say(line):
    print(f"{NAME}: {line}", flush=True)


def train_flags(command):
    """train.py's flags in the launcher's command: what follows the training script."""
    for index, word in enumerate(command):
        if os.path.basename(word) == "train.py":
            return command[index + 1 :]
    raise ValueError("the command names no train.py")


def newest_checkpoint(flags):
    """(the checkpoint folder, its newest checkpoint that verifies or "-"); None for bad
    flags (job_progress has said why, in train.py's own line)."""
    found = subprocess.run(
        [sys.executable, "-m", "paddle_resnet.commands.job_progress", *flags],
        stdout=subprocess.PIPE,
        text=True,
    )
    if found.returncode != 0:
        return None
    folder, newest = found.stdout.strip().split("\t")
    return folder, newest


def read_count(path):
    try:
        with open(path) as handle:
            state = json.load(handle)
        return int(state["starts_without_progress"]), state["checkpoint"]
    except FileNotFoundError:
        return 0, "-"


def write_count(path, starts, checkpoint):
    staged = f"{path}.tmp"
    with open(staged, "w") as handle:
        json.dump({"starts_without_progress": starts, "checkpoint": checkpoint}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staged, path)  # never a half-written count on the shared claim


def check_progress(flags, environ):
    """None to go on, or the exit status of a start that must not train."""
    limit = int(environ.get(MAX_STARTS_VARIABLE, DEFAULT_MAX_STARTS))
    found = newest_checkpoint(flags)
    if found is None:
        return USER_ERROR
    folder, newest = found
    count_file = os.path.join(
        os.path.dirname(folder), f".k8s-starts-{environ.get('JOBSET_UID') or 'local'}"
    )
    starts, checkpoint_then = read_count(count_file)
    if newest != "-" and newest != checkpoint_then:
        starts = 0  # the starts before wrote a checkpoint
    if starts >= limit:
        say(
            f"{starts} start(s) in a row without a new checkpoint that verifies "
            f"(newest: {newest}; {MAX_STARTS_VARIABLE}={limit}): not training again, exit "
            f"{USER_ERROR}; the earlier pods' logs say why (kubectl logs --previous), and "
            f"removing {count_file} allows {limit} more"
        )
        return USER_ERROR
    os.makedirs(os.path.dirname(count_file), exist_ok=True)
    write_count(count_file, starts + 1, newest)  # this start, until it shows progress
    say(f"start {starts + 1} in a row without progress so far (newest checkpoint: {newest})")
    return None


def main(argv, environ=os.environ):
    if not argv or argv[0] != "--" or len(argv) < 2:
        say("usage: start_node.py -- COMMAND ... train.py TRAIN_FLAGS...")
        return USER_ERROR
    command = argv[1:]
    if environ.get("JOB_COMPLETION_INDEX", "0") == "0":
        try:
            status = check_progress(train_flags(command), environ)
        except ValueError as problem:
            say(f"cannot count the starts without progress: {problem}")
            return USER_ERROR
        except OSError as problem:  # the claim's I/O: a restart may fix it (maxRestarts)
            say(f"cannot count the starts without progress: {problem}")
            return RESTARTABLE
        if status is not None:
            return status
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
