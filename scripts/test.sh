#!/usr/bin/env bash
# The test suite: set up, lint (ruff check and ruff format --check, configured in
# pyproject.toml), then run pytest in four tracks, one after the other:
#   1. Paddle 2.6.2 in .venv (the pinned version; the GPU build on GPU machines): all tests;
#   2. the GPU build, paddlepaddle-gpu 2.6.2, in .venv-gpu, executing on the CPU: the tests
#      whose behaviour can differ on that build (marker gpu_wheel) and the GPU programs
#      built and checked as data (cuda_build); skipped where .venv already is the GPU
#      build, and with SKIP_GPU_WHEEL=1;
#   3. Paddle 3.3.1 in .venv-paddle3, its legacy static IR and PIR (--ir pir; SKIP_PADDLE3=1
#      skips it and the next);
#   4. the PIR-only rehearsal: Paddle 3.3.1 with the legacy IR unavailable
#      (PADDLE_RESNET_PIR_ONLY=1), the tests of what users do (marker pir_rehearsal: train,
#      ASP prune-then-retrain, QAT, PTQ, export, int8 deployment, 2 ranks, evaluation,
#      resume), which track 3 leaves to it.
# The environments of tracks 2 and 3 are set up in the background, beside .venv's and
# then while track 1 runs. Extra arguments go to every pytest run; the exit status is
# non-zero if any failed.
#
# Each track runs on TEST_WORKERS pytest processes (pytest-xdist; default 2, one a core),
# a test file at a time each (--dist loadfile: a file's module fixtures are built once).
# Much of a test's time is a single-threaded Python process, a launcher waiting on its
# ranks or a timeout running out: one process at a time left a core idle (track 1 on the
# 2-core AVX-512 Xeon: 14 min 13 s alone, 9 min 34 s on two). Two processes of track 1 fit
# in memory since the scopes made to read exports are freed (paddle_internals.
# private_scope; a worker peaked at 10.3 GB, both at 15.7 GB of 24 GB); TRACK1_WORKERS=1
# runs it on one. Idle OpenMP threads sleep instead of spinning (KMP_BLOCKTIME,
# OMP_WAIT_POLICY): two Paddle processes side by side, or a 2-rank job of two threads a
# rank, share the cores without futex storms. One math thread a process (OMP_NUM_THREADS,
# which the toolkit keeps): with a worker a core, a second thread only adds its
# synchronisation (a two-epoch ResNet-18 run of the tests' kind on the AVX2 EPYC: 12.6-13.1
# CPU-s at one thread, 14.1 at two: docs/measurements.md). The resume tests, the proof of
# determinism, train at two (conftest.straight_and_resumed), as a single process does on
# two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python caches the bytecode of each module the first time a process imports it; with
# PYTHONDONTWRITEBYTECODE=1 (set on this project's machines) the set-up compiled every file
# instead (scripts/installer.sh says what that cost).
unset PYTHONDONTWRITEBYTECODE
export KMP_BLOCKTIME=0 OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
workers=(-n "${TEST_WORKERS:-2}" --dist loadfile)
track1_workers=(-n "${TRACK1_WORKERS:-${TEST_WORKERS:-2}}" --dist loadfile)

gpu_wheel_track=1
[ "${SKIP_GPU_WHEEL:-0}" = 1 ] && gpu_wheel_track=0
# A machine with an NVIDIA GPU gets the GPU build in .venv (scripts/setup.sh): track 1 covers it.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_wheel_track=0
fi
paddle3_track=1
[ "${SKIP_PADDLE3:-0}" = 1 ] && paddle3_track=0

setup_log=$(mktemp)
serve_log=$(mktemp)
trap 'rm -f "$setup_log" "$serve_log"' EXIT
# The serving environment (.venv-serve: KServe, Paddle 3.3.1) beside the others, from the
# start: tests/test_serve.py (track 1) waits on its lock if it is still installing.
bash scripts/setup_serve.sh > "$serve_log" 2>&1 &
serve_pid=$!
(
  [ "$paddle3_track" = 1 ] && { VENV=.venv-paddle3 PADDLE_VERSION=3.3.1 bash scripts/setup.sh || exit 1; }
  [ "$gpu_wheel_track" = 1 ] && { VENV=.venv-gpu PADDLE_BUILD=gpu bash scripts/setup.sh || exit 1; }
  exit 0
) > "$setup_log" 2>&1 &
setup_pid=$!
bash scripts/setup.sh
bash scripts/setup_slurm.sh            # Slurm for tests/test_slurm.py (skipped without it)
bash scripts/setup_etcd.sh             # etcd for the elastic launcher's test (skipped without it)
# NNCF beside .venv for tests/test_nncf.py (OpenVINO's own int8; skipped without it)
bash scripts/setup_nncf.sh || echo "setup_nncf: NNCF could not be installed: tests/test_nncf.py will skip"

status=0
echo "== lint: ruff check, ruff format --check"
{ .venv/bin/ruff check --quiet . && .venv/bin/ruff format --check --quiet .; } || status=$?
echo "== track 1: the suite on Paddle 2.6.2"
.venv/bin/python -m pytest tests "${track1_workers[@]}" "$@" || status=$?
if ! wait "$serve_pid"; then
  cat "$serve_log"
  status=1
fi
grep '^setup_serve:' "$serve_log" || true

if ! wait "$setup_pid"; then
  cat "$setup_log"
  exit 1
fi
grep '^setup: paddle' "$setup_log" || true
if [ "$gpu_wheel_track" = 1 ]; then
  echo "== track 2: the GPU build (paddlepaddle-gpu 2.6.2) without a GPU"
  .venv-gpu/bin/python -m pytest tests -m "gpu_wheel or cuda_build" "${workers[@]}" "$@" || status=$?
fi
if [ "$paddle3_track" = 1 ]; then
  echo "== track 3: the suite on Paddle 3.3.1 (legacy IR and PIR)"
  .venv-paddle3/bin/python -m pytest tests -m "not pir_rehearsal" "${workers[@]}" "$@" || status=$?
  echo "== track 4: the PIR-only rehearsal on Paddle 3.3.1 (the legacy IR unavailable)"
  PADDLE_RESNET_PIR_ONLY=1 .venv-paddle3/bin/python -m pytest tests -m pir_rehearsal \
    "${workers[@]}" "$@" || status=$?
fi
exit "$status"
