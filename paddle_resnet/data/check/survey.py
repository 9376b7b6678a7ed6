"""The data check's survey: every image's header read once, counted per class and into the
findings it shows, with the key each leaves for the duplicate search."""

import dataclasses
from collections import Counter
from typing import Dict, List

import numpy as np

from paddle_resnet.data.check.findings import FAR_SMALLER, Finding

GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
# EXIF orientations that turn or mirror the image (1 is normal; other values mean none)
TURNED = range(2, 9)


@dataclasses.dataclass
class Survey:
    """What the fast pass found, split by split."""

    crop_size: int
    findings: Dict[str, Finding]
    per_class: Dict[str, Counter] = dataclasses.field(default_factory=dict)
    broken: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # positions
    keys: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    images: int = 0
    gray: int = 0

    def read(self, source):
        """Read the headers of ``source`` (a TreeSplit or RecordSplit) into the survey."""
        counts, broken, keys = Counter(), [], []
        for position, (label, header) in enumerate(source.headers()):
            counts[label] += 1
            self.images += 1
            if not 0 <= label < len(source.classes):
                self._count("label", source, position)
            if header.problem:
                broken.append(position)
                self._count(problem_kind(header.problem), source, position)
                keys.append(0)
                continue
            keys.append(int.from_bytes(header.key[:8], "little") or 1)
            self._read_image(source, position, header)
        self.per_class[source.split] = counts
        self.broken[source.split] = broken
        self.keys[source.split] = np.array(keys, dtype=np.uint64)

    def _count(self, kind, source, position):
        self.findings[kind].add(lambda: source.name(position))

    def _read_image(self, source, position, header):
        mode = header.mode
        if mode in GRAY_MODES:
            self.gray += 1
            self._count("gray", source, position)
        for kind, holds in (
            ("cmyk", mode == "CMYK"),
            ("deep", header.bits > 8),
            ("alpha", mode in ALPHA_MODES),
            ("palette", mode in ("P", "PA")),
            ("oriented", header.orientation in TURNED),
        ):
            if holds:
                self._count(kind, source, position)
        shorter = min(header.width, header.height)
        if shorter < self.crop_size:
            kind = "far_smaller" if shorter * FAR_SMALLER < self.crop_size else "smaller"
            self._count(kind, source, position)


def problem_kind(problem):
    """The finding of an ImageHeader's problem."""
    if problem.startswith("cannot be read"):
        return "unreadable"
    return "not_image" if problem == "not an image" else "broken"
