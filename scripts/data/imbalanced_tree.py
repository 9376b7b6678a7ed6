"""An unbalanced copy of an image tree, as symbolic links, validation untouched. For
measuring what the toolkit does about imbalance on real images.

A long tail by default: class i of N keeps ``largest * ratio ** (-i / (N - 1))`` training
images (the first class the most, the last ``ratio`` times fewer). With ``--rare K``, K
classes keep ``largest / ratio`` and the others ``largest``. ``--seed S`` orders the
classes by a permutation drawn with S before the rule applies (which classes are rare is
then chosen by S, not by their names); ``largest`` is the smallest class of the source.

    .venv/bin/python scripts/data/imbalanced_tree.py demo_data/fashion_mnist_demo \
        demo_data/fashion_mnist_20to1 --ratio 20
    .venv/bin/python scripts/data/imbalanced_tree.py demo_data/digits \
        demo_data/digits_3rare_10to1_seed1 --ratio 10 --rare 3 --seed 1
"""

import argparse
import os
import sys

import numpy as np

from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.data.folder import folder_contents


def kept_images(largest, count, ratio, rare=None):
    """Training images kept by position in the class order: a geometric tail from
    ``largest`` down to ``largest / ratio``, or ``rare`` classes at ``largest / ratio``
    first and the rest at ``largest``."""
    if rare is None:
        return [round(largest * ratio ** (-i / (count - 1))) for i in range(count)]
    return [max(1, round(largest / ratio))] * rare + [largest] * (count - rare)


def write_tree(source, destination, ratio, rare=None, seed=None):
    source = os.path.abspath(source)
    if os.path.exists(destination):
        raise UserError(f"{destination} exists: remove it or choose another destination")
    classes = sorted(os.listdir(os.path.join(source, "train")))
    if rare is not None and not 0 < rare < len(classes):
        raise UserError(f"--rare {rare}: must be between 1 and {len(classes) - 1} classes")
    images = {name: folder_contents(os.path.join(source, "train", name))[0] for name in classes}
    largest = min(map(len, images.values()))
    order = (
        classes
        if seed is None
        else [classes[i] for i in np.random.RandomState(seed).permutation(len(classes))]
    )
    for name, keep in zip(order, kept_images(largest, len(classes), ratio, rare)):
        os.makedirs(os.path.join(destination, "train", name))
        for image in images[name][:keep]:
            os.symlink(image, os.path.join(destination, "train", name, os.path.basename(image)))
    for name in classes:
        print(f"train/{name}: {len(os.listdir(os.path.join(destination, 'train', name)))} images")
    os.symlink(os.path.join(source, "val"), os.path.join(destination, "val"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("destination")
    parser.add_argument("--ratio", type=float, default=20.0)
    parser.add_argument("--rare", type=int, help="this many rare classes (default: a long tail)")
    parser.add_argument("--seed", type=int, help="order the classes by a permutation of this seed")
    args = parser.parse_args()
    write_tree(args.source, args.destination, args.ratio, args.rare, args.seed)


if __name__ == "__main__":
    sys.exit(exit_status(main))
