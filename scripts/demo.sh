#!/usr/bin/env bash
# The demo: set up, write Fashion-MNIST as JPEGs, train ResNet-18 v1.5 and evaluate
# it on all 10,000 validation images. Extra arguments go to train.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/data/fashion_mnist_to_jpeg.py --output demo_data/fashion_mnist_demo \
  --train-per-class 3500
# The demo starts afresh each time: train.py refuses to mix a new run's checkpoints
# with an earlier run's in the same folder.
rm -rf output/demo
exec .venv/bin/python train.py --config resnet18_demo "$@"
