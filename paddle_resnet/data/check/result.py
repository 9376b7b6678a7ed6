"""The data check's result: the counts of each split and the findings, as the tool's lines,
a training run's start lines, the JSON document and the exit status."""

import dataclasses
from typing import Dict, Optional

from paddle_resnet.data.check.findings import Finding, counted


@dataclasses.dataclass
class Result:
    """The check of one data set: the lines to print, a JSON document, an exit status."""

    image_root: str
    format: str
    crop_size: int
    splits: Dict[str, dict]
    kinds: Dict[str, Finding]  # every kind, found or not
    images: int
    seconds: float
    decode: Optional[dict] = None

    @property
    def findings(self):
        return [f for f in self.kinds.values() if f.count]

    @property
    def status(self):
        return 1 if any(f.serious for f in self.findings) else 0

    def start_lines(self):
        """A training run's lines: the counts and time in one, a warning per finding."""
        splits = "; ".join(describe_split(name, split) for name, split in self.splits.items())
        serious = [f for f in self.findings if f.serious]
        verdict = counted(len(serious), "finding") if serious else "no findings"
        head = f"data check ({self.seconds:.1f} s; --no-data-check skips it): {splits}; {verdict}"
        return [head] + [f.line("warning") for f in serious]

    def lines(self):
        rate = self.images / max(self.seconds, 1e-9)
        done = [f"fast pass: {self.images:,} images in {self.seconds:.1f} s ({rate:,.0f} img/s)"]
        if self.decode:
            d = self.decode
            done.append(
                f"decode: {d['images']:,} images by DALI's CPU decoder on {d['threads']} "
                f"threads in {d['seconds']:.1f} s: {d['images_per_second']:,.0f} img/s"
            )
        serious = sum(f.serious for f in self.findings)
        verdict = counted(serious, "finding") if serious else "no findings"
        splits = [describe_split(name, split) for name, split in self.splits.items()]
        return splits + [f.line() for f in self.findings] + done + [verdict]

    def as_dict(self):
        return {
            "image_root": self.image_root,
            "format": self.format,
            "crop_size": self.crop_size,
            "splits": self.splits,
            "findings": [dataclasses.asdict(f) for f in self.findings if f.serious],
            "notes": [dataclasses.asdict(f) for f in self.findings if not f.serious],
            "fast_pass": {"images": self.images, "seconds": round(self.seconds, 3)},
            "decode": self.decode,
            "status": self.status,
        }


def describe_split(name, split):
    classes = counted(split["classes"], "class")
    if not split["images"]:
        return f"{name}: {classes}, no images"
    head = f"{name}: {classes}, {counted(split['images'], 'image')}, "
    (small, fewest), (large, most) = split["smallest"], split["largest"]
    if fewest == most:
        return head + f"{most:,} per class"
    return (
        head + f"{fewest:,} ({small}) to {most:,} ({large}) per class: "
        f"imbalance {split['imbalance']:.1f}:1"
    )


def split_counts(source, counts):
    """The JSON of one split's counts: per class, smallest, largest, their ratio."""
    per_class = {name: counts.get(label, 0) for label, name in enumerate(source.classes)}
    filled = {name: n for name, n in per_class.items() if n}
    summary = {"classes": len(per_class), "images": sum(counts.values()), "per_class": per_class}
    if filled:
        small, large = min(filled, key=filled.get), max(filled, key=filled.get)
        summary.update(
            smallest=[small, filled[small]],
            largest=[large, filled[large]],
            imbalance=round(filled[large] / filled[small], 2),
        )
    return summary
