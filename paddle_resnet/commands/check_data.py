"""Check an image tree (or its record files) before training on it.

    paddle-resnet-check-data --image-root demo_data/fashion_mnist_demo --config resnet18_demo
    paddle-resnet-check-data --image-root /data/imagenet --decode --json check.json
    paddle-resnet-check-data --image-root /data/records --data-format tfrecord

Per split the classes and images per class; then one line per finding with a count and
up to three examples (``paddle_resnet/data/check/findings.py`` lists them), notes on
what the pipeline does with the images, and the pass's rate. Sizes are judged against the crop
(--crop-size, or the recipe's with --config). Exit status 0: no findings; 1: findings;
2: the data cannot be read (a missing root, an unreadable record file).
"""

import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import main_with


def main(argv=None):
    bootstrap.prepare_process(argv)
    from paddle_resnet.data import check

    return main_with("check_data", __doc__.splitlines()[0], check.report, argv, REGISTRY_CHOICES)


if __name__ == "__main__":
    sys.exit(main())
