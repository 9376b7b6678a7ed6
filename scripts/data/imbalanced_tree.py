"""An unbalanced copy of an image tree, as symbolic links: class i of N keeps
``largest * ratio ** (-i / (N - 1))`` training images (the first class the most, the
last ``ratio`` times fewer), validation untouched. For measuring --class-weights on
real images.

    .venv/bin/python scripts/data/imbalanced_tree.py demo_data/fashion_mnist_demo \
        demo_data/fashion_mnist_20to1 --ratio 20
"""

import argparse
import os
import sys

from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.data.folder import list_images


def write_tree(source, destination, ratio):
    source = os.path.abspath(source)
    if os.path.exists(destination):
        raise UserError(f"{destination} exists: remove it or choose another destination")
    classes = sorted(os.listdir(os.path.join(source, "train")))
    largest = min(len(list_images(os.path.join(source, "train", name))) for name in classes)
    for position, name in enumerate(classes):
        keep = round(largest * ratio ** (-position / (len(classes) - 1)))
        os.makedirs(os.path.join(destination, "train", name))
        for image in list_images(os.path.join(source, "train", name))[:keep]:
            os.symlink(image, os.path.join(destination, "train", name, os.path.basename(image)))
        print(f"train/{name}: {keep} images")
    os.symlink(os.path.join(source, "val"), os.path.join(destination, "val"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("destination")
    parser.add_argument("--ratio", type=float, default=20.0)
    args = parser.parse_args()
    write_tree(args.source, args.destination, args.ratio)


if __name__ == "__main__":
    sys.exit(exit_status(main))
