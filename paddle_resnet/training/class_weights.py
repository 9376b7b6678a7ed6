"""How much each class counts in the training loss: --class-weights, deferred by
--class-weights-from-epoch, and --logit-adjustment. What a run feeds its train program
per class each step is a ``ClassBalance`` (``for_run``); ``programs.py`` builds the loss.

``balanced`` weighs a class by its inverse frequency, N / (C * n_c) (scikit-learn's); a
FILE gives the weights by class name (JSON or CSV). The loss is the weighted mean over
the batch, sum(w_i * loss_i) / sum(w_i), as PyTorch's ``CrossEntropyLoss(weight=...)``;
MixUp blends the two images' weights as it blends their targets. Validation stays
unweighted. Deferred re-weighting (Cao et al. 2019): the epochs before
--class-weights-from-epoch are fed weights of 1, chosen by epoch, so a resume within an
epoch feeds the same. Logit adjustment (Menon et al. 2021): TAU x log(prior) added to
the logits inside the training loss only; TAU 1 is balanced softmax."""

import csv
import heapq
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from paddle_resnet.core import feeds
from paddle_resnet.core.errors import ConfigError, DataError
from paddle_resnet.core.text_files import parse_json, read_text

BALANCED = "balanced"
# The largest weight a file may give: the batch's weighted float32 sum (at most 3.4e38)
# leaves room for 65,536 images of loss 5,000.
MAX_WEIGHT = 1e30


@dataclass(frozen=True)
class ClassBalance:
    """The per-class vectors a run feeds its train program (None where not used)."""

    weights: Optional[np.ndarray]
    from_epoch: int
    logit_offsets: Optional[np.ndarray]

    def feeds(self, epoch):
        """{feed name: float32 vector} of training epoch ``epoch`` (1-based)."""
        fed = {}
        if self.weights is not None:
            deferred = epoch < self.from_epoch
            fed[feeds.CLASS_WEIGHTS] = np.ones_like(self.weights) if deferred else self.weights
        if self.logit_offsets is not None:
            fed[feeds.LOGIT_OFFSETS] = self.logit_offsets
        return fed

    def describe(self, loss_config, classes):
        lines = []
        if self.weights is not None:
            line = describe(loss_config.class_weights, self.weights, classes)
            if self.from_epoch > 1:
                line += f", from epoch {self.from_epoch} (the plain loss before it)"
            lines.append(line)
        if self.logit_offsets is not None:
            low, high = int(np.argmin(self.logit_offsets)), int(np.argmax(self.logit_offsets))
            lines.append(
                f"logit adjustment (tau {loss_config.logit_adjustment:g} x log prior, training "
                f"loss only): {self.logit_offsets[low]:.3g} ({classes[low]}) to "
                f"{self.logit_offsets[high]:.3g} ({classes[high]})"
            )
        return lines


def for_run(config, split):
    """The ``ClassBalance`` of a run training on ``split``, or None for the plain loss;
    refuses --sampling class-balanced on record files (it needs an image tree's counts)."""
    loss = config.loss
    spec, from_epoch, tau = loss.class_weights, loss.class_weights_from_epoch, loss.logit_adjustment
    if config.data.sampling == "class-balanced":
        class_counts(split, "--sampling class-balanced")
    weights = resolve(spec, split)
    offsets = logit_offsets(tau, split) if tau > 0 else None
    if weights is None and offsets is None:
        return None
    return ClassBalance(weights, from_epoch, offsets)


def logit_offsets(tau, split):
    """``tau`` x log(each class's share of ``split``'s images), float32."""
    counts = class_counts(split, "--logit-adjustment")
    empty = [name for name, count in zip(split.classes, counts) if count == 0]
    if empty:
        raise DataError(
            f"--logit-adjustment: no training image of class {empty[0]!r}, whose prior "
            "would be 0 (its log minus infinity)"
        )
    offsets = tau * np.log(counts / counts.sum())
    rarest = int(np.argmin(offsets))
    if offsets[rarest] < -np.finfo(np.float32).max:  # -inf in the float32 the loss adds
        raise ConfigError(
            f"--logit-adjustment {tau:g}: class {split.classes[rarest]!r}'s offset, "
            f"{offsets[rarest]:.3g}, is beyond float32 (its logits would be -inf)"
        )
    return offsets.astype(np.float32)


def resolve(spec, split):
    """The float32 weight of each class of ``split``, or None without ``spec``."""
    if spec is None:
        return None
    if spec == BALANCED:
        counts = class_counts(split)
        return (counts.sum() / (len(counts) * counts)).astype(np.float32)
    return _from_file(spec, split.classes)


def class_counts(split, needed_by=f"--class-weights {BALANCED}"):
    """The number of images of each class of an image tree's ``split``."""
    if split.image_list is None:
        instead = (
            "give the weights as a file (--class-weights FILE: JSON or CSV of weights by "
            "class name)"
            if needed_by.startswith("--class-weights")
            else "train from the image tree they were written from"
        )
        raise DataError(
            f"{needed_by} counts the images of each class of an image tree; "
            f"for {split.split} record files {instead}"
        )
    return np.bincount(split.image_list.labels, minlength=len(split.classes)).astype(np.float64)


def _from_file(path, classes):
    if not os.path.isfile(path):
        raise ConfigError(
            f"--class-weights {path!r}: neither {BALANCED} nor a file (JSON or CSV of "
            "weights by class name)"
        )
    text = read_text(path, ConfigError, what="--class-weights file")
    try:
        if path.lower().endswith(".json"):
            by_name = parse_json(text, path, ConfigError)
            if not isinstance(by_name, dict):
                raise ValueError("expected an object of class name: weight")
        else:
            by_name = {row[0].strip(): row[1] for row in csv.reader(text.splitlines()) if row}
            by_name.pop("class", None)  # an optional header line: class,weight
    except (ValueError, IndexError) as err:
        raise ConfigError(f"--class-weights {path}: not a JSON or CSV of weights ({err})") from None
    # the names first: a file of a million lines is refused without converting them
    unknown = heapq.nsmallest(5, set(by_name) - set(classes))
    missing = [name for name in classes if name not in by_name]
    if unknown or missing:
        raise ConfigError(
            f"--class-weights {path}: its class names are not the data's: "
            f"unknown {unknown}, missing {missing[:5]}"
        )
    try:
        weights = {name: float(by_name[name]) for name in classes}
    except (ValueError, TypeError) as err:
        raise ConfigError(f"--class-weights {path}: not a JSON or CSV of weights ({err})") from None
    bad = [name for name in classes if not 0 < weights[name] <= MAX_WEIGHT]
    if bad:
        raise ConfigError(
            f"--class-weights {path}: weights must be positive and at most {MAX_WEIGHT:g} "
            f"(larger ones overflow the float32 loss), not {weights[bad[0]]:g} for "
            f"{bad[0]!r}" + (f" ({len(bad)} such)" if len(bad) > 1 else "")
        )
    return np.array([weights[name] for name in classes], dtype=np.float32)


def describe(spec, weights, classes):
    low, high = int(np.argmin(weights)), int(np.argmax(weights))
    return (
        f"class weights ({spec}): {weights[low]:.3g} ({classes[low]}) to "
        f"{weights[high]:.3g} ({classes[high]})"
    )
