#!/usr/bin/env bash
# Profile a window of training steps with Nsight Systems, as NVIDIA's
# scripts/nsys_profiling.sh does, with its environment variables:
#   ENABLE_PROFILE=1 PROFILE_START_STEP=100 PROFILE_STOP_STEP=120 bash scripts/nsys_profiling.sh [train.py flags]
# Each step is an NVTX range, and the window is nsys's capture range (cudaProfilerApi);
# the Paddle profiler also writes a Chrome trace to <output-dir>/profile. With
# ENABLE_PROFILE=0 (or no nsys) the same training runs without nsys.
set -euo pipefail
cd "$(dirname "$0")/.."
ENABLE_PROFILE=${ENABLE_PROFILE:-1}
PROFILE_START_STEP=${PROFILE_START_STEP:-100}
PROFILE_STOP_STEP=${PROFILE_STOP_STEP:-120}
NUM_GPUS=${NUM_GPUS:-8}
python=${PYTHON:-.venv/bin/python}
gpus=$(seq -s, 0 $((NUM_GPUS - 1)))
train=("$python" -m paddle.distributed.launch --gpus="$gpus" train.py --epochs 1
       --profile-start-step "$PROFILE_START_STEP" --profile-stop-step "$PROFILE_STOP_STEP" "$@")
if [ "$ENABLE_PROFILE" -ge 1 ] && command -v nsys >/dev/null; then
  mkdir -p log
  exec nsys profile --stats=true --output ./log/%p --force-overwrite true \
    -t cuda,nvtx,osrt,cudnn,cublas --capture-range=cudaProfilerApi --capture-range-end=stop \
    --gpu-metrics-device=0 --sample=cpu -d 60 --kill=sigkill -x true "${train[@]}"
fi
exec "${train[@]}"
