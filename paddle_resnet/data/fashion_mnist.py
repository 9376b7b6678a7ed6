"""Write Fashion-MNIST (Debian package dataset-fashion-mnist) as an ImageNet-style JPEG tree.

    python scripts/data/fashion_mnist_to_jpeg.py --output demo_data/fashion_mnist
    (or python -m paddle_resnet.data.fashion_mnist ...)

<output>/train/<class>/*.jpg from the training split, <output>/val/<class>/*.jpg from
the test split; re-running with the same arguments reuses a complete tree.
"""

import argparse
import gzip
import json
import os
import shutil
import sys

import numpy as np
from PIL import Image

from paddle_resnet.core.errors import DataError, exit_status

SOURCE = "/usr/share/datasets/fashion-mnist"
CLASSES = tuple(
    "tshirt_top trouser pullover dress coat sandal shirt sneaker bag ankle_boot".split()
)


def read_idx(path):
    """IDX file (big-endian magic, dims, then uint8 data) as a NumPy array."""
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def write_split(images, labels, folder, per_class):
    counts = [0] * len(CLASSES)
    for name in CLASSES:
        os.makedirs(os.path.join(folder, name), exist_ok=True)
    for index, (image, label) in enumerate(zip(images, labels)):
        if per_class is not None and counts[label] >= per_class:
            continue
        counts[label] += 1
        Image.fromarray(image, mode="L").save(
            os.path.join(folder, CLASSES[label], f"{index:05d}.jpg"), quality=95
        )
    return sum(counts)


def write_tree(output, train_per_class=None, val_per_class=None, source=SOURCE, log=print):
    """Write (or reuse, if complete with the same arguments) the JPEG tree at ``output``."""
    if not os.path.isdir(source):
        raise DataError(
            f"{source} not found; install it with 'apt-get install -y dataset-fashion-mnist'"
        )
    stamp_path = os.path.join(output, "COMPLETE.json")
    stamp = {"train_per_class": train_per_class, "val_per_class": val_per_class}
    if os.path.exists(stamp_path):
        with open(stamp_path) as handle:
            if json.load(handle) == stamp:
                log(f"{output}: already complete")
                return output
    shutil.rmtree(output, ignore_errors=True)
    for split, prefix, per_class in (
        ("train", "train", train_per_class),
        ("val", "t10k", val_per_class),
    ):
        images = read_idx(os.path.join(source, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(source, f"{prefix}-labels-idx1-ubyte.gz"))
        written = write_split(images, labels, os.path.join(output, split), per_class)
        log(f"{output}/{split}: {written} JPEGs in {len(CLASSES)} classes")
    with open(stamp_path, "w") as handle:
        json.dump(stamp, handle)
    return output


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="demo_data/fashion_mnist")
    parser.add_argument("--source", default=SOURCE, help="folder with the *-ubyte.gz files")
    parser.add_argument(
        "--train-per-class", type=int, help="training images per class (default: all 6,000)"
    )
    parser.add_argument(
        "--val-per-class", type=int, help="validation images per class (default: all 1,000)"
    )
    args = parser.parse_args()
    return exit_status(
        lambda: write_tree(args.output, args.train_per_class, args.val_per_class, args.source)
    )


if __name__ == "__main__":
    sys.exit(main())
