"""--class-weights: how much each class's images weigh in the training loss.

``balanced`` weighs a class by its inverse frequency in the training split, N / (C * n_c)
(scikit-learn's "balanced"): a class of 30 images then counts as much as one of 3,000,
and the weights average 1 over the training images. A FILE gives them by class name, as
JSON ({"cat": 2.0, ...}) or CSV (``name,weight`` lines). The loss is the weighted mean
over the batch, sum(w_i * loss_i) / sum(w_i), where an image's weight is its class's
(PyTorch's ``CrossEntropyLoss(weight=...)`` normalises so too); label smoothing changes
the target, not the weight; MixUp blends the two images' weights as it blends their
targets. Validation loss and accuracy stay unweighted (the per-class results show what
the weights changed)."""

import csv
import json
import os

import numpy as np

from paddle_resnet.core.errors import ConfigError, DataError

BALANCED = "balanced"


def resolve(spec, split):
    """The float32 weight of each class of ``split`` (a training ``DataSplit``), or None
    without ``spec`` (--class-weights)."""
    if spec is None:
        return None
    if spec == BALANCED:
        counts = class_counts(split)
        return (counts.sum() / (len(counts) * counts)).astype(np.float32)
    return _from_file(spec, split.classes)


def class_counts(split):
    """The number of images of each class of ``split`` (an image tree's)."""
    if split.image_list is None:
        raise DataError(
            f"--class-weights {BALANCED} counts the images of each class of an image tree; "
            f"for {split.split} record files give the weights as a file (--class-weights "
            "FILE: JSON or CSV of weights by class name)"
        )
    return np.bincount(split.image_list.labels, minlength=len(split.classes)).astype(np.float64)


def _from_file(path, classes):
    if not os.path.isfile(path):
        raise ConfigError(
            f"--class-weights {path!r}: neither {BALANCED} nor a file (JSON or CSV of "
            "weights by class name)"
        )
    with open(path, newline="") as handle:
        text = handle.read()
    try:
        if path.lower().endswith(".json"):
            by_name = json.loads(text)
            if not isinstance(by_name, dict):
                raise ValueError("expected an object of class name: weight")
        else:
            by_name = {row[0].strip(): row[1] for row in csv.reader(text.splitlines()) if row}
            by_name.pop("class", None)  # an optional header line: class,weight
        weights = {name: float(value) for name, value in by_name.items()}
    except (ValueError, IndexError, TypeError) as err:
        raise ConfigError(f"--class-weights {path}: not a JSON or CSV of weights ({err})") from None
    unknown = sorted(set(weights) - set(classes))
    missing = [name for name in classes if name not in weights]
    if unknown or missing:
        raise ConfigError(
            f"--class-weights {path}: its class names are not the data's: "
            f"unknown {unknown[:5]}, missing {missing[:5]}"
        )
    bad = [name for name in classes if not weights[name] > 0]
    if bad:
        raise ConfigError(f"--class-weights {path}: weights must be positive, not for {bad[:5]}")
    return np.array([weights[name] for name in classes], dtype=np.float32)


def describe(spec, weights, classes):
    """One line for people: where the weights came from and their range."""
    low, high = int(np.argmin(weights)), int(np.argmax(weights))
    return (
        f"class weights ({spec}): {weights[low]:.3g} ({classes[low]}) to "
        f"{weights[high]:.3g} ({classes[high]})"
    )
