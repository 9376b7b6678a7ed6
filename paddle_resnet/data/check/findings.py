"""The data check's catalogue of findings, as data, in the order they are printed
(``CATALOGUE``), and the thresholds behind them."""

import dataclasses
from typing import List, NamedTuple

from paddle_resnet.data.folder import IMAGE_EXTENSIONS

EXAMPLES = 3
# Largest over smallest class from which the imbalance is a finding: ImageNet's 1.8:1
# is not one; the 20:1 of a rare class beside a common one is.
IMBALANCE_FINDING = 10
# An image whose shorter side is under crop / FAR_SMALLER is upscaled more than this
# into the network's input: a finding. Less is a note (the demo's 28-px Fashion-MNIST
# images go into a 32-px crop: 1.14x, as the recipe intends).
FAR_SMALLER = 2


def counted(count, noun):
    return f"{count:,} {noun if count == 1 else noun + ('es' if noun.endswith('s') else 's')}"


@dataclasses.dataclass
class Finding:
    """One kind of finding: how many, the first examples; a note is not a finding."""

    kind: str
    noun: str  # what is counted: image, file, class, ...
    text: str  # what is found, after the count
    serious: bool = True  # a finding (exit status 1), else a note
    count: int = 0
    examples: List[str] = dataclasses.field(default_factory=list)

    def add(self, example):
        """One more; ``example`` (a name, or a function making it, called only while
        examples are wanted: a finding may hold a million) kept among the first EXAMPLES."""
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(example() if callable(example) else example)

    def line(self, label=None):
        """``finding: <count> <text>: <examples>``; a text holding ``{count}`` places it there."""
        count = counted(self.count, self.noun)
        what = self.text.format(count=count) if "{count}" in self.text else f"{count} {self.text}"
        listed = ", ".join(self.examples) + (", ..." if self.count > len(self.examples) else "")
        label = label or ("finding" if self.serious else "note")
        return f"{label}: {what}: {listed}"

    def restated(self, kind):
        """The same count and examples, told as the catalogue's ``kind`` tells them."""
        return dataclasses.replace(self, noun=kind.noun, text=kind.text, serious=kind.serious)


class Kind(NamedTuple):
    """A kind of finding as the catalogue declares it; ``new_findings`` fills in its text."""

    kind: str
    noun: str
    text: str
    serious: bool = True


# image trees are screened before DALI sees them; record files are not: {refused} says
# what happens to a broken file of each
CATALOGUE = (
    Kind("missing_split", "split", "missing (train.py reads train/ and val/)"),
    Kind("empty_class", "class folder", "without images ({refused})"),
    Kind("missing_class", "class", "missing from a split{refused_classes}"),
    Kind("label", "record", "with a label that is no class of classes.json"),
    Kind("unreadable", "file", "that cannot be read ({refused})"),
    Kind(
        "not_image",
        "file",
        "that Pillow cannot identify as an image (not one, or cut short within its "
        "header; {refused})",
    ),
    Kind("broken", "image", "cut short or corrupt ({refused})"),
    Kind("undecodable", "image", "DALI cannot decode (training would stop on them)"),
    Kind(
        "ignored",
        "file",
        "the loaders skip (outside a class folder, or not named {extensions})",
    ),
    Kind(
        "unfollowed",
        "linked folder",
        "not followed (it leads back into its split or to a folder walked already, whose "
        "images would count twice; the loaders skip it too)",
    ),
    Kind(
        "leak",
        "image",
        "in both the train and val splits (the same bytes: a leak into the validation figure)",
    ),
    Kind("relabelled", "image", "stored under more than one class of a split (the same bytes)"),
    Kind(
        "imbalance",
        "split",
        "with classes {imbalance}:1 or more apart (--sampling class-balanced draws every "
        "class equally often: the best of the methods measured on unbalanced cuts)",
    ),
    Kind(
        "cmyk",
        "CMYK image",
        "(DALI converts them to RGB without a colour profile: colours may differ from "
        "what viewers show; convert them to RGB JPEGs)",
    ),
    Kind("deep", "image", "of more than 8 bits per channel (DALI decodes them to 8)"),
    Kind(
        "alpha",
        "image",
        "with an alpha channel (DALI drops it: transparent areas show the colour "
        "stored under them)",
    ),
    Kind(
        "gray",
        "grayscale image",
        "among colour ones (DALI decodes them to RGB, the gray in all three "
        "channels; the model sees both kinds)",
    ),
    Kind(
        "far_smaller",
        "image",
        "far smaller than the {crop_size}-px crop (shorter side under {far} px: "
        "upscaled more than {upscale}x)",
    ),
    Kind(
        "smaller",
        "image",
        "smaller than the {crop_size}-px crop (shorter side {far} px or more: "
        "upscaled up to {upscale}x)",
        serious=False,
    ),
    Kind("palette", "palette image", "(DALI expands them to RGB)", serious=False),
    Kind(
        "oriented",
        "JPEG",
        "with an EXIF orientation other than normal (DALI turns them upright, as viewers "
        "and the server do)",
        serious=False,
    ),
)
# What ``gray`` becomes when every readable image is grayscale: how the data set is, a note
ALL_GRAY = Kind(
    "gray",
    "image",
    "all {count} are grayscale (DALI decodes them to RGB, the gray in all three channels)",
    serious=False,
)


def new_findings(crop_size, fmt):
    """Every kind of ``CATALOGUE``, empty, its text filled in for the crop and the format."""
    values = {
        "refused": "train.py refuses them" if fmt == "folder" else "DALI fails on them mid-run",
        "refused_classes": " (train.py refuses them)" if fmt == "folder" else "",
        "crop_size": crop_size,
        "far": crop_size // FAR_SMALLER,
        "upscale": FAR_SMALLER,
        "imbalance": IMBALANCE_FINDING,
        "extensions": "/".join(e[1:] for e in IMAGE_EXTENSIONS),
    }
    return {
        k.kind: Finding(k.kind, k.noun, k.text.format(count="{count}", **values), k.serious)
        for k in CATALOGUE
    }
