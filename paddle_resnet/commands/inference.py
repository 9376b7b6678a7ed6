"""Run an exported model with Paddle Inference: accuracy, benchmark, predict or serve.

    python inference.py --inference-dir inference/resnet18_demo --mode accuracy \\
        --image-root demo_data/fashion_mnist_demo
    python inference.py --inference-dir inference/resnet50 --mode benchmark \\
        --backend cpu --cpu-precision bf16 --benchmark-batch-sizes 1,32 --use-synthetic
    python inference.py --inference-dir inference/resnet18_demo --mode predict \\
        --images photo.jpg,more_photos/
    python inference.py --inference-dir inference/resnet18_demo --mode serve   # paddle-resnet-serve

Preprocessing (resize, crop, normalisation, layout) comes from the model's
model.json, written by export_model.py, so it always matches training.
"""

import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import main_with


def main(argv=None):
    bootstrap.prepare_process(argv)
    from paddle_resnet.deploy import inference_modes

    doc = __doc__.splitlines()[0]
    return main_with("inference", doc, inference_modes.run, argv, REGISTRY_CHOICES)


if __name__ == "__main__":
    sys.exit(main())
