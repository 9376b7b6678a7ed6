# What train.sbatch and train_multinode.sbatch share, sourced by both from the job's working
# directory (the repository's root): the knobs, the checks of the arguments, the count of
# starts without progress, the wait for the training, and what its exit status makes of
# the job (docs/guide.md, "Exit statuses"). Each script sets SCRIPT_NAME and defines
# `start_training` (run the command in the background, its pid in $training) and
# `pass_warning` (hand the time limit's warning on to the training as SIGTERM), then calls
# `run_job "$@"`.
# shellcheck shell=bash

# Knobs (environment variables; sbatch passes the submitting shell's environment on).
# PYTHON: the interpreter with Paddle, the same path on every node; default the
# repository's .venv, else python3.
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  PYTHON=python3
  [ -x .venv/bin/python ] && PYTHON=$PWD/.venv/bin/python
fi
# NPROC_PER_NODE: training processes per node, one per GPU: the GPUs Slurm gave the job
# (--gres=gpu:N / --gpus-per-node), else the visible ones, else 1 (the CPU).
gpus_on_node() {
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
    echo "$SLURM_GPUS_ON_NODE"
  elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$CUDA_VISIBLE_DEVICES" != NoDevFiles ]; then
    tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .
  elif command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then
    nvidia-smi -L | grep -c '^GPU'
  else
    echo 1
  fi
}
NPROC_PER_NODE=${NPROC_PER_NODE:-$(gpus_on_node)}
# LAUNCH_LOG_DIR: the launchers' per-rank logs (workerlog.N, appended across restarts);
# one folder per job. Folders of jobs that ended more than LOG_DAYS days ago are removed
# when a job of the same folder starts (as are their .slurm-crashes-* counts).
LAUNCH_LOG_DIR=${LAUNCH_LOG_DIR:-log/slurm-${SLURM_JOB_ID:-local}}
LOG_DAYS=${LOG_DAYS:-30}
# MAX_RESTARTS: the script stops requeueing itself after a warning once the job has been
# restarted this many times (a time limit too short for any progress would otherwise
# requeue the job for ever).
MAX_RESTARTS=${MAX_RESTARTS:-100}
# MAX_CRASHES_WITHOUT_PROGRESS: a crashed job is requeued until this many starts in a row
# ended without a new checkpoint that verifies (a crash that repeats: a bad node, a batch
# that does not fit). A start counts as one without progress from its beginning, so a
# start that never reports (the node lost, this shell killed) counts too; counted in
# <output-dir>/.slurm-crashes-<job id>.
MAX_CRASHES_WITHOUT_PROGRESS=${MAX_CRASHES_WITHOUT_PROGRESS:-3}
TRAIN_SCRIPT=${TRAIN_SCRIPT:-train.py}

say() { echo "$SCRIPT_NAME: $*"; }

# "<checkpoint folder><tab><its newest checkpoint that verifies, or ->" of train.py's flags
# "$@". Bad flags fail here, in train.py's own line, exit 2.
job_progress() {
  "$PYTHON" -m paddle_resnet.commands.job_progress "$@"
}

# The training's status (multi-node: the launchers' statuses combined).
training_status() {
  echo "$1"
}

# Whether Slurm still lists the job RUNNING. When it ends or requeues the job (scancel,
# scontrol requeue, preemption, the time limit) it has sent SIGTERM to every process of
# the job itself, and a second one would cut the launcher's grace from 30 s to 10 s
# ("Force quit in 10 seconds"); a SIGTERM to this shell alone is passed on.
# shellcheck disable=SC2317  # (called by the traps)
job_running() {
  [ "$(timeout 10 squeue --noheader --jobs "${SLURM_JOB_ID:-0}" --format=%T 2> /dev/null)" = RUNNING ]
}

# shellcheck disable=SC2317  # (called by the traps)
forward() { # $1: the signal this shell received
  interrupted=1
  [ -n "$training" ] || return 0
  if [ "$1" = TERM ] && ! job_running; then
    say "got SIGTERM at $(date +%T): Slurm is ending the job and signalled the training itself"
    return 0
  fi
  warned=1 # the time limit's warning, or a SIGTERM to this shell alone: requeue after it
  say "got SIG$1 at $(date +%T): passing SIGTERM to the training"
  pass_warning
  return 0
}

requeue() {
  trap '' TERM USR1 # the requeue sends SIGTERM to this shell, which is done
  if scontrol requeue "$SLURM_JOB_ID"; then
    exit 0
  fi
  say "scontrol requeue failed: resubmit this script with the same arguments to continue"
  exit 1
}

run_job() {
  if [ ! -f "$TRAIN_SCRIPT" ]; then
    say "no $TRAIN_SCRIPT in $PWD: submit from the repository's root or pass sbatch --chdir <repo>"
    exit 2
  fi
  for arg in "$@"; do
    case "$arg" in
      --from-checkpoint | --from-checkpoint=*)
        say "leave --from-checkpoint out: the script resumes each start with --from-checkpoint auto"
        exit 2
        ;;
    esac
  done
  local found checkpoints before after crashes_file crashes status code progress
  found=$(job_progress "$@") || exit 2
  checkpoints=${found%%$'\t'*}
  before=${found#*$'\t'}
  crashes_file=$(dirname "$checkpoints")/.slurm-crashes-${SLURM_JOB_ID:-local}
  mkdir -p "$(dirname "$crashes_file")" "$LAUNCH_LOG_DIR"
  # Paddle's launcher writes each rank's whole environment (tokens, keys) into its log
  # folder (backup_env.<rank>.json, envlog.<rank>, mode 0644): the folder is the job
  # owner's alone, whatever the files' modes on the shared volume.
  chmod 700 "$LAUNCH_LOG_DIR"
  find "$(dirname "$checkpoints")" -maxdepth 1 -name '.slurm-crashes-*' -mtime +"$LOG_DAYS" -delete 2> /dev/null
  find "$(dirname "$LAUNCH_LOG_DIR")" -mindepth 1 -maxdepth 1 -type d -name 'slurm-*' \
    -mtime +"$LOG_DAYS" -exec rm -rf {} + 2> /dev/null
  crashes=$(cat "$crashes_file" 2> /dev/null)
  crashes=$((${crashes:-0} + 1)) # this start, until it shows progress
  echo "$crashes" > "$crashes_file"

  # The training runs in the background: bash runs a trap only between commands, and
  # `wait` is the one command a signal interrupts.
  warned=0
  interrupted=0
  training=
  command=() # set by start_training
  trap 'forward USR1' USR1
  trap 'forward TERM' TERM
  start_training "$@" --from-checkpoint auto
  say "job ${SLURM_JOB_ID:-?} start $((${SLURM_RESTART_COUNT:-0} + 1)) (SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-$(hostname)} in $PWD: ${command[*]}"
  status=
  while :; do
    interrupted=0
    wait "$training" 2> /dev/null
    code=$?
    # 127: the previous wait already collected the status (a trap ran after it returned)
    [ "$code" = 127 ] && [ -n "$status" ] && break
    status=$code
    # a trap cut the wait short (status 128 + signal): the training is still stopping
    [ "$interrupted" = 1 ] && [ "$code" -gt 128 ] && continue
    break
  done
  status=$(training_status "$status")

  found=$(job_progress "$@")
  after=${found#*$'\t'}
  if [ "$after" != "$before" ] && [ "$after" != - ]; then
    crashes=0
    echo 0 > "$crashes_file"
    progress="after writing checkpoint $after"
  else
    progress="without a new checkpoint that verifies, $crashes start(s) in a row"
  fi
  case "$status" in
    0)
      rm -f "$crashes_file"
      say "training finished"
      exit 0
      ;;
    2)
      say "training failed with exit status 2 (input that no restart can fix): not requeued"
      exit 2
      ;;
    15 | 143 | 130)
      # 143/130: train.py stopped by SIGTERM/SIGINT (saved at its step, or stopped before
      # training began); 15: the launcher, after its ranks stopped.
      if [ "$warned" = 1 ]; then
        if [ "$crashes" != 0 ]; then
          say "stopped by the warning (exit $status) $progress: not requeued (a start that never trained would only start again)"
          exit 1
        fi
        if [ "${SLURM_RESTART_COUNT:-0}" -ge "$MAX_RESTARTS" ]; then
          say "stopped by the warning (exit $status); not requeued: $MAX_RESTARTS restarts already (MAX_RESTARTS)"
          exit 1
        fi
        say "stopped by the warning (exit $status): requeueing job $SLURM_JOB_ID"
        requeue
      fi
      say "stopped by a signal (exit $status): Slurm requeues or cancels the job"
      exit "$status"
      ;;
    *)
      if [ "$crashes" -ge "$MAX_CRASHES_WITHOUT_PROGRESS" ]; then
        say "training failed with exit status $status $progress: not requeued (MAX_CRASHES_WITHOUT_PROGRESS=$MAX_CRASHES_WITHOUT_PROGRESS); the lines above say why"
        exit "$status"
      fi
      say "training crashed with exit status $status $progress: requeueing job $SLURM_JOB_ID"
      requeue
      ;;
  esac
}
