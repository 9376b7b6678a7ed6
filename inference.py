"""Run an exported model: accuracy, benchmark or predict (Paddle Inference, TensorRT,
oneDNN or OpenVINO).

    python inference.py --inference-dir inference/resnet18_demo --mode accuracy \\
        --image-root demo_data/fashion_mnist_demo

An entry point only: what it does is paddle_resnet/commands/inference.py.
"""

import sys

from paddle_resnet.commands import inference

if __name__ == "__main__":
    sys.exit(inference.main())
