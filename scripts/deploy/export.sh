#!/usr/bin/env bash
# Export a checkpoint to a Paddle Inference model.
#   bash scripts/deploy/export.sh CHECKPOINT OUTPUT_DIR [export_model.py flags ...]
# e.g. bash scripts/deploy/export.sh output/resnet50_paddle_90e_AMP/resnet50 inference/resnet50_AMP \
#        --config resnet50_paddle_90e --data-layout NHWC
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 CHECKPOINT OUTPUT_DIR [export_model.py flags ...]" >&2; exit 2; }
checkpoint=$1 output=$2
shift 2
cd "$(dirname "$0")/../.."
exec .venv/bin/python export_model.py --from-checkpoint "$checkpoint" \
  --inference-dir "$output" --export-log-path "$output.export.json" "$@"
