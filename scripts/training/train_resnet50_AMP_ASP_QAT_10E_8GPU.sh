#!/usr/bin/env bash
# Sparse INT8 on 8 GPUs, NVIDIA's order: quantization-aware training with NVIDIA's QAT
# schedule (10 epochs, AMP, LR 5e-5) of a 2:4 model, its ASP masks kept on every step.
# Argument: the 2:4 checkpoint folder of train_resnet50_AMP_ASP_90E_8GPU.sh (e.g.
# output/resnet50_paddle_90e_AMP_ASP/resnet50). Export with export_model.py --asp --qat.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SPARSE_CHECKPOINT_FOLDER [train.py flags ...]" >&2; exit 2; }
sparse=$1
shift
exec bash "$(dirname "$0")/launch.sh" resnet50_paddle_90e 8 AMP --asp --qat --epochs 10 \
  --lr 0.00005 --from-checkpoint "$sparse" --output-dir output/resnet50_paddle_90e_AMP_ASP_QAT "$@"
