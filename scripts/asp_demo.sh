#!/usr/bin/env bash
# 2:4 sparsity on the demo: prune the dense demo model (scripts/demo.sh must have run),
# evaluate it right after pruning, retrain one epoch with the same recipe, and print
# dense / pruned / retrained top-1 with the classes that lost most. Extra arguments go to
# train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
dense=output/demo/resnet18
[ -f "$dense/2/model.pdparams" ] || { echo "run scripts/demo.sh first ($dense/2 is missing)" >&2; exit 2; }
rm -rf output/demo_asp             # a fresh run each time (no mixing with an earlier one)
.venv/bin/python train.py --config resnet18_demo --asp --prune-model --mask-algo "${MASK_ALGO:-mask_1d}" \
  --from-pretrained-params "$dense/2/model.pdparams" --epochs 1 --warmup-epochs 0 \
  --output-dir output/demo_asp "$@"
.venv/bin/python -m paddle_resnet.commands.check_sparsity output/demo_asp/resnet18 | tail -n 1
# dense, pruned (before retraining) and retrained top-1, and the classes pruning cost most
.venv/bin/python scripts/compare_classes.py output/demo/report.json output/demo_asp/report.json \
  --output benchmarks/asp_classes_resnet18_demo.json
