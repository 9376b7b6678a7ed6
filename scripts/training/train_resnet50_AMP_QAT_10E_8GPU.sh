#!/usr/bin/env bash
# ResNet-50 v1.5 quantization-aware training (NVIDIA's 2024 recipe: 10 epochs from the
# trained dense model, AMP, LR 5e-5) on 8 GPUs. Argument: the dense parameters
# (.pdparams). Export the result with export_model.py --qat for INT8 inference.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DENSE_PARAMS.pdparams [train.py flags ...]" >&2; exit 2; }
dense=$1
shift
exec bash "$(dirname "$0")/launch.sh" resnet50_paddle_90e 8 AMP --qat --epochs 10 --lr 0.00005 \
  --from-pretrained-params "$dense" --output-dir output/resnet50_paddle_90e_AMP_QAT "$@"
