#!/usr/bin/env bash
# Sparse INT8 on the demo, NVIDIA's order: the 2:4 model of scripts/asp_demo.sh (pruned
# from the dense demo model and fine-tuned with its masks), then one epoch of
# quantization-aware training from it with the masks kept, then one table: dense fp32,
# 2:4 fp32, 2:4 + PTQ (each algorithm), 2:4 + QAT, in oneDNN int8 on all validation
# images (benchmarks/sparse_int8_resnet18_demo.json). Extra arguments go to the QAT run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f output/demo_asp/resnet18/1/model.pdparams ] || bash scripts/asp_demo.sh
rm -rf output/demo_sparse_qat
.venv/bin/python train.py --config resnet18_demo --asp --qat --from-checkpoint output/demo_asp/resnet18 \
  --epochs 1 --lr 0.004 --warmup-epochs 0 --output-dir output/demo_sparse_qat "$@"
.venv/bin/python -m paddle_resnet.commands.check_sparsity output/demo_sparse_qat/resnet18 | tail -n 1
.venv/bin/python scripts/compare_quantization.py output/demo_asp/resnet18 demo_data/fashion_mnist_demo \
  --qat-checkpoint output/demo_sparse_qat/resnet18 --dense-checkpoint output/demo/resnet18 \
  --output benchmarks/sparse_int8_resnet18_demo.json
