#!/usr/bin/env bash
# The whole path a GPU user runs, on one GPU, in a few minutes: one line per step with its
# verdict (PASS / FAIL and the step's last error line) and seconds, exit 1 if any failed.
#
#   bash scripts/gpu_smoke.sh            # GPU 0; SMOKE_DIR=... keeps the files elsewhere
#
# Steps, each on what the one before made: the preflight (a usable GPU and TensorRT),
# AMP training with DALI's GPU decoding (nvJPEG) on Fashion-MNIST JPEGs, 2:4 pruning then
# retraining, the export, Paddle-TRT FP32 / FP16 / INT8 (calibrated on validation images)
# accuracy over every validation image, each reduced precision within SMOKE_TOP1_DROP
# points of FP32's top-1 (default 1.0). Sized to end within 8 minutes on one datacenter
# GPU (ResNet-18 at 32 px, 20,000 training images, 1 epoch each).
#
# Not executed: no machine this project has had has a GPU build of Paddle with a GPU
# (README, "Feature matrix"); it is written against the commands the README documents.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
dir=${SMOKE_DIR:-output/gpu_smoke}
data=$dir/fashion_mnist
drop_limit=${SMOKE_TOP1_DROP:-1.0}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
failed=0
declare -A top1

# step NAME COMMAND...: runs COMMAND with its output in $dir/NAME.log; one verdict line.
step() {
  local name=$1 start=$SECONDS
  shift
  if "$@" > "$dir/$name.log" 2>&1; then
    printf 'PASS %-22s %4d s\n' "$name" $((SECONDS - start))
  else
    local why
    why=$(grep -E '^(error|Error|FAIL)' "$dir/$name.log" | tail -n 1)
    printf 'FAIL %-22s %4d s  %s (log: %s)\n' "$name" $((SECONDS - start)) \
      "${why:-$(tail -n 1 "$dir/$name.log")}" "$dir/$name.log"
    failed=1
  fi
}

# accuracy PRECISION: Paddle-TRT at PRECISION over every validation image; its top-1 (from
# the inference report's ACCURACY record) kept for the comparison
accuracy() {
  local precision=$1 calibrate=() log=$dir/accuracy_$precision.json
  [ "$precision" = INT8 ] && calibrate=(--trt-use-calib-mode True)
  "$python" inference.py --inference-dir "$dir/inference" --mode accuracy --backend trt \
    --trt-precision "$precision" "${calibrate[@]}" --image-root "$data" \
    --inference-log-path "$log" || return 1
  top1[$precision]=$("$python" -c 'import json, sys
records = [json.loads(line) for line in open(sys.argv[1]) if "ACCURACY" in line]
print(100 * records[-1]["data"]["top1"])' "$log") || return 1
  echo "$precision top-1 ${top1[$precision]} %"
}

# within PRECISION: its top-1 within drop_limit points of FP32's
within() {
  local precision=$1
  "$python" - "${top1[FP32]:-}" "${top1[$precision]:-}" "$drop_limit" "$precision" <<'EOF'
import sys
fp32, low, limit, name = sys.argv[1:]
if not fp32 or not low:
    sys.exit(f"error: no top-1 read for FP32 ({fp32 or '-'}) or {name} ({low or '-'})")
drop = float(fp32) - float(low)
print(f"{name} top-1 {low} against FP32's {fp32}: {drop:+.2f} points")
if drop > float(limit):
    sys.exit(f"error: {name} loses {drop:.2f} points of top-1 (limit {limit})")
EOF
}

rm -rf "$dir" && mkdir -p "$dir"
step preflight "$python" -m paddle_resnet.commands.doctor --require gpu,trt
step data "$python" scripts/data/fashion_mnist_to_jpeg.py --output "$data" \
  --train-per-class 2000 --val-per-class 500
# DALI decodes on the GPU (nvJPEG) wherever the process has one: the run's first lines say
step amp_dali_gpu "$python" train.py --config resnet18_demo --image-root "$data" --epochs 1 \
  --amp --scale-loss 128 --use-dynamic-loss-scaling --output-dir "$dir/dense"
step prune_retrain "$python" train.py --config resnet18_demo --image-root "$data" --epochs 1 \
  --amp --asp --prune-model --from-pretrained-params "$dir/dense/resnet18/1/model.pdparams" \
  --warmup-epochs 0 --output-dir "$dir/sparse"
step sparsity "$python" -m paddle_resnet.commands.check_sparsity "$dir/sparse/resnet18"
step export "$python" export_model.py --config resnet18_demo --asp \
  --from-checkpoint "$dir/sparse/resnet18" --inference-dir "$dir/inference"
for precision in FP32 FP16 INT8; do
  step "accuracy_$precision" accuracy "$precision"
done
for precision in FP16 INT8; do
  step "top1_$precision" within "$precision"
done
[ "$failed" = 0 ] && echo "gpu smoke: every step passed ($SECONDS s)" \
  || echo "gpu smoke: a step failed ($SECONDS s)"
exit "$failed"
