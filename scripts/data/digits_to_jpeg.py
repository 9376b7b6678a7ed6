"""Write scikit-learn's UCI handwritten digits (1,797 real 8x8 greyscale scans, 10
classes, read offline from the scikit-learn wheel) as an ImageNet-style JPEG tree: a
small real data set that nothing in this repository generated, for trying fine-tuning.

    .venv/bin/pip install scikit-learn
    .venv/bin/python scripts/data/digits_to_jpeg.py --output demo_data/digits

<output>/train/<digit>/*.jpg and <output>/val/<digit>/*.jpg: --val-share of each class
(drawn with --seed) for validation, the rest for training. The images stay 8x8 pixels
(the pipeline resizes them, as it would a user's; the data check says they are smaller
than the crop).
"""

import argparse
import os
import sys

import numpy as np
from PIL import Image

from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.core.optional import require


def write_tree(output, val_share, seed):
    if os.path.exists(output):
        raise UserError(f"{output} exists: remove it or choose another --output")
    digits = require("sklearn.datasets", "writing the digits").load_digits()
    pixels = np.round(digits.images * 255.0 / 16.0).astype(np.uint8)  # 0-16 -> 0-255
    rng = np.random.RandomState(seed)
    counts = {"train": 0, "val": 0}
    for digit in range(10):
        indices = np.flatnonzero(digits.target == digit)
        rng.shuffle(indices)
        cut = int(round(val_share * len(indices)))
        for split, chosen in (("val", indices[:cut]), ("train", indices[cut:])):
            folder = os.path.join(output, split, str(digit))
            os.makedirs(folder, exist_ok=True)
            for index in chosen:
                Image.fromarray(pixels[index], mode="L").save(
                    os.path.join(folder, f"{index:04d}.jpg"), quality=95
                )
            counts[split] += len(chosen)
    print(f"{output}: {counts['train']} training and {counts['val']} validation JPEGs, 10 classes")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="demo_data/digits")
    parser.add_argument("--val-share", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_tree(args.output, args.val_share, args.seed)


if __name__ == "__main__":
    sys.exit(exit_status(main))
