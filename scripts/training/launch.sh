#!/usr/bin/env bash
# Launch a recipe on GPUs: one process per GPU through paddle.distributed.launch.
#   bash scripts/training/launch.sh RECIPE GPUS PRECISION [train.py flags ...]
# RECIPE: a name in configs/ (train.py --list-configs); GPUS: 1, 8 or a list such as
# 0,1,2,3; PRECISION: AMP (fp16 mixed precision, NHWC, dynamic loss scaling from 128,
# as NVIDIA's AMP scripts) or TF32 (fp32 weights; TF32 math on Ampere by default).
# The image tree is taken from $IMAGE_ROOT (default /imagenet). DRY_RUN=1 prints the
# command, one argument per line, instead of running it.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 RECIPE GPUS AMP|TF32 [train.py flags ...]" >&2; exit 2; }
recipe=$1 gpus=$2 precision=$3
shift 3
cd "$(dirname "$0")/../.."
case "$gpus" in
  1) gpu_list=0 ;;
  8) gpu_list=0,1,2,3,4,5,6,7 ;;
  *) gpu_list=$gpus ;;
esac
case "$precision" in
  AMP) precision_flags=(--amp --scale-loss 128.0 --use-dynamic-loss-scaling --data-layout NHWC) ;;
  TF32) precision_flags=() ;;
  *) echo "PRECISION must be AMP or TF32, not $precision" >&2; exit 2 ;;
esac
command=(.venv/bin/python -m paddle.distributed.launch --gpus "$gpu_list" train.py
  --config "$recipe" --image-root "${IMAGE_ROOT:-/imagenet}"
  --output-dir "output/${recipe}_${precision}" "${precision_flags[@]}" "$@")
if [ "${DRY_RUN:-0}" = 1 ]; then
  printf '%s\n' "${command[@]}"
  exit 0
fi
exec "${command[@]}"
