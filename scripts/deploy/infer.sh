#!/usr/bin/env bash
# Benchmark an exported model: throughput and latency percentiles at batch 1..256.
#   bash scripts/deploy/infer.sh MODEL_DIR BACKEND PRECISION [inference.py flags ...]
# BACKEND: trt (PRECISION FP32 | FP16 | INT8) or cpu (PRECISION fp32 | bf16 | int8;
# int8 needs a model exported with --ptq-algo or --qat).
# Add --mode accuracy --image-root DIR for top-1/top-5 over a validation tree.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 MODEL_DIR trt|cpu PRECISION [inference.py flags ...]" >&2; exit 2; }
model=$1 backend=$2 precision=$3
shift 3
cd "$(dirname "$0")/../.."
case "$backend" in
  trt) precision_flag=(--trt-precision "$precision") ;;
  cpu) precision_flag=(--cpu-precision "$precision") ;;
  *) echo "BACKEND must be trt or cpu, not $backend" >&2; exit 2 ;;
esac
exec .venv/bin/python inference.py --inference-dir "$model" --backend "$backend" \
  "${precision_flag[@]}" --mode benchmark --benchmark-batch-sizes "${BATCH_SIZES:-1,2,4,8,16,32,64,128,256}" \
  --benchmark-warmup-steps 20 --benchmark-steps 100 \
  --inference-log-path "$model.$backend-$precision.json" "$@"
