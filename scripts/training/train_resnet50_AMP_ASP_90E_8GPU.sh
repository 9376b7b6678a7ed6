#!/usr/bin/env bash
# ResNet-50 v1.5 2:4 sparse retraining (NVIDIA recipe: prune a dense model, retrain
# 90 epochs with AMP) on 8 GPUs. Argument: the dense parameters (.pdparams).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DENSE_PARAMS.pdparams [train.py flags ...]" >&2; exit 2; }
dense=$1
shift
exec bash "$(dirname "$0")/launch.sh" resnet50_paddle_90e 8 AMP --asp --prune-model \
  --mask-algo mask_1d --from-pretrained-params "$dense" \
  --output-dir output/resnet50_paddle_90e_AMP_ASP "$@"
