"""Write Fashion-MNIST as an ImageNet-style JPEG tree (see paddle_resnet/data/fashion_mnist.py)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from paddle_resnet.data.fashion_mnist import main  # noqa: E402

if __name__ == "__main__":
    main()
