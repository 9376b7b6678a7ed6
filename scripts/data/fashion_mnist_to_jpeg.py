"""Write Fashion-MNIST as an ImageNet-style JPEG tree (see paddle_resnet/data/fashion_mnist.py)."""

import sys

from paddle_resnet.data.fashion_mnist import main

if __name__ == "__main__":
    sys.exit(main())
