"""Train and evaluate a ResNet-family classifier (NVIDIA's flags; --help lists them).

    python train.py --config resnet18_demo --image-root demo_data/fashion_mnist_demo
    python -m paddle.distributed.launch --gpus 0,1,2,3,4,5,6,7 train.py \\
        --config resnet50_paddle_90e --amp --image-root /data/imagenet

An entry point only: what it does is paddle_resnet/commands/train.py.
"""

import sys

from paddle_resnet.commands import train

if __name__ == "__main__":
    sys.exit(train.main())
