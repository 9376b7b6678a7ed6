"""The data check: what an image tree (or its record files) holds, and what in it training
would refuse, skip or change without a word, found before hours of training.

    paddle-resnet-check-data --image-root DIR [--config NAME] [--decode] [--json FILE]

Per split: the classes and the images per class (smallest, largest, their ratio). Then
one line per kind of finding, with a count and up to three examples: files that are not
images or are cut short, empty class folders, classes missing from a split, files the
loaders skip, CMYK / 16-bit / alpha images and grayscale ones among colour ones (with
what DALI's decoder makes of them), images far smaller than the crop, the same image in
train/ and val/ (a leak into the validation figure) or under two classes of a split, an
imbalance of 10:1 or more. Notes say what the pipeline does with a property the whole
set shares (all grayscale, all a little smaller than the crop, palettes); they are not
findings.

Two depths. The fast pass reads each file's header (Pillow's lazy open: no decode; a
JPEG's end marker) and hashes its size with its first 4 KB: only files whose keys agree
can be the same image, and only those are hashed whole (BLAKE2b) to confirm. ``decode``
adds a full decode by DALI's CPU decoder on every core, as training decodes, and its
rate. A training run starts with the fast pass, once per job (``screening.py``): its
findings are warnings, broken images are refused as the loaders refuse them.
"""

import dataclasses
import hashlib
import io
import json
import os
import time
from collections import Counter
from typing import Dict, List, Optional, Tuple

import numpy as np

from paddle_resnet.core.atomic import atomic_files
from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.class_index import CLASSES_FILE, read_class_index
from paddle_resnet.core.errors import DataError
from paddle_resnet.data import records
from paddle_resnet.data.dali import undecodable
from paddle_resnet.data.folder import (
    IMAGE_EXTENSIONS,
    class_contents,
    class_folders,
    file_reading_pool,
    folder_contents,
    image_root_folder,
    read_headers,
    stream_header,
)

SPLITS = records.SPLITS
EXAMPLES = 3
# Largest over smallest class from which the imbalance is a finding: ImageNet's 1.8:1
# is not one; the 20:1 of a rare class beside a common one is.
IMBALANCE_FINDING = 10
# An image whose shorter side is under crop / FAR_SMALLER is upscaled more than this
# into the network's input: a finding. Less is a note (the demo's 28-px Fashion-MNIST
# images go into a 32-px crop: 1.14x, as the recipe intends).
FAR_SMALLER = 2
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


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
        examples are wanted: a finding may hold every image of a million) kept among the
        first EXAMPLES."""
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(example() if callable(example) else example)

    def line(self, label=None):
        """``finding: <count> <text>: <examples>`` (or ``label``: ...); a text holding
        ``{count}`` places the count there."""
        count = counted(self.count, self.noun)
        what = self.text.format(count=count) if "{count}" in self.text else f"{count} {self.text}"
        listed = ", ".join(self.examples) + (", ..." if self.count > len(self.examples) else "")
        label = label or ("finding" if self.serious else "note")
        return f"{label}: {what}: {listed}"


@dataclasses.dataclass
class TreeSplit:
    """One split of an image tree: its image files by class, and what the loaders skip."""

    split: str
    root: str
    classes: Tuple[str, ...]
    files: List[str]
    labels: List[int]
    empty: List[str] = dataclasses.field(default_factory=list)  # class folders
    ignored: List[str] = dataclasses.field(default_factory=list)  # files not named as images

    @classmethod
    def scan(cls, image_root, split):
        """Every class folder of <image_root>/<split>, empty ones too (the loaders'
        ``scan_split`` stops at the first)."""
        split_dir = os.path.join(image_root, split)
        found = cls(split, image_root, tuple(class_folders(split_dir)), [], [])
        found.ignored.extend(sum(folder_contents(split_dir), []))  # outside a class folder
        for label, name in enumerate(found.classes):
            # sub-folders of a class are of the class, as the loaders read them (scan_split)
            images, others = class_contents(os.path.join(split_dir, name))
            if not images:
                found.empty.append(os.path.join(split_dir, name))
            found.files.extend(images)
            found.labels.extend([label] * len(images))
            found.ignored.extend(others)
        return found

    def headers(self):
        """(label, ImageHeader) of each image, in order."""
        return zip(self.labels, read_headers(self.files))

    def name(self, position):
        return os.path.relpath(self.files[position], self.root)

    def content(self, position):
        return records.read_bytes(self.files[position])

    def encoded(self, skip):
        """(position, encoded bytes) of each image but the positions in ``skip``."""
        for position in range(len(self.files)):
            if position not in skip:
                yield position, self.content(position)


@dataclasses.dataclass
class RecordSplit:
    """One split of a record set: its data file, index and the class index beside them."""

    split: str
    fmt: str
    classes: Tuple[str, ...]
    data_path: str
    index_path: str
    offsets: List[int] = dataclasses.field(default_factory=list)  # of each record, as read
    labels: List[int] = dataclasses.field(default_factory=list)

    def _images(self):
        return records.record_format(self.fmt).images(self.data_path, self.index_path)

    def headers(self):
        """(label, ImageHeader) of each record's image: the file is read through once."""
        for offset, label, image in self._images():
            self.offsets.append(offset)
            self.labels.append(label)
            yield label, stream_header(io.BytesIO(image), len(image))

    def name(self, position):
        return f"{os.path.basename(self.data_path)} record {position}"

    def content(self, position):
        return records.record_format(self.fmt).image_at(self.data_path, self.offsets[position])

    def encoded(self, skip):
        for position, (_, _, image) in enumerate(self._images()):
            if position not in skip:
                yield position, image


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


def new_findings(crop_size, fmt):
    """Every kind of finding, empty, in the order they are printed."""
    # image trees are screened before DALI sees them; record files are not
    refused = "train.py refuses them" if fmt == "folder" else "DALI fails on them mid-run"
    refused_classes = " (train.py refuses them)" if fmt == "folder" else ""
    far = crop_size // FAR_SMALLER
    kinds = [
        Finding("missing_split", "split", "missing (train.py reads train/ and val/)"),
        Finding("empty_class", "class folder", f"without images ({refused})"),
        Finding("missing_class", "class", "missing from a split" + refused_classes),
        Finding("label", "record", "with a label that is no class of classes.json"),
        Finding("unreadable", "file", f"that cannot be read ({refused})"),
        Finding(
            "not_image",
            "file",
            f"that Pillow cannot identify as an image (not one, or cut short within its "
            f"header; {refused})",
        ),
        Finding("broken", "image", f"cut short or corrupt ({refused})"),
        Finding("undecodable", "image", "DALI cannot decode (training would stop on them)"),
        Finding(
            "ignored",
            "file",
            "the loaders skip (outside a class folder, or not named "
            f"{'/'.join(e[1:] for e in IMAGE_EXTENSIONS)})",
        ),
        Finding(
            "leak",
            "image",
            "in both the train and val splits (the same bytes: a leak into the validation figure)",
        ),
        Finding(
            "relabelled", "image", "stored under more than one class of a split (the same bytes)"
        ),
        Finding(
            "imbalance",
            "split",
            f"with classes {IMBALANCE_FINDING}:1 or more apart (--class-weights balanced "
            "weighs them evenly in the loss)",
        ),
        Finding(
            "cmyk",
            "CMYK image",
            "(DALI converts them to RGB without a colour profile: colours may differ from "
            "what viewers show; convert them to RGB JPEGs)",
        ),
        Finding("deep", "image", "of more than 8 bits per channel (DALI decodes them to 8)"),
        Finding(
            "alpha",
            "image",
            "with an alpha channel (DALI drops it: transparent areas show the colour "
            "stored under them)",
        ),
        Finding(
            "gray",
            "grayscale image",
            "among colour ones (DALI decodes them to RGB, the gray in all three "
            "channels; the model sees both kinds)",
        ),
        Finding(
            "far_smaller",
            "image",
            f"far smaller than the {crop_size}-px crop (shorter side under {far} px: "
            f"upscaled more than {FAR_SMALLER}x)",
        ),
        Finding(
            "smaller",
            "image",
            f"smaller than the {crop_size}-px crop (shorter side {far} px or more: "
            f"upscaled up to {FAR_SMALLER}x)",
            serious=False,
        ),
        Finding("palette", "palette image", "(DALI expands them to RGB)", serious=False),
    ]
    return {f.kind: f for f in kinds}


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
        """The kinds found (findings and notes), in their order."""
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

    def summary_lines(self):
        return [describe_split(name, split) for name, split in self.splits.items()]

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
        verdict = f"{counted(serious, 'finding')}" if serious else "no findings"
        findings = [f.line() for f in self.findings]
        return self.summary_lines() + findings + done + [verdict]

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


# ---------------------------------------------------------------- the same image twice


def full_digest(source, position):
    return hashlib.blake2b(source.content(position), digest_size=16).digest()


def same_images(sources, keys):
    """Groups of (split, position) holding the same bytes: the keys (size and first 4 KB)
    find the candidates, a hash of the whole confirms."""
    splits = list(sources)
    all_keys = np.concatenate([keys[s] for s in splits])
    starts = np.cumsum([0] + [len(keys[s]) for s in splits])
    order = np.argsort(all_keys, kind="stable")
    ordered = all_keys[order]
    same = (ordered[1:] == ordered[:-1]) & (ordered[1:] != 0)  # 0: a broken file
    candidates = []
    for index in np.unique(np.concatenate([order[1:][same], order[:-1][same]])):
        split = int(np.searchsorted(starts, index, side="right")) - 1
        candidates.append((splits[split], int(index - starts[split])))
    with file_reading_pool() as pool:
        digests = list(pool.map(lambda c: full_digest(sources[c[0]], c[1]), candidates))
    groups = {}
    for candidate, digest in zip(candidates, digests):
        groups.setdefault(digest, []).append(candidate)
    return [group for group in groups.values() if len(group) > 1]


def read_duplicates(sources, groups, findings):
    """The same image in train/ and val/ (a leak), or under two classes of a split."""
    for group in groups:
        names = [sources[s].name(p) for s, p in group]
        if len({s for s, _ in group}) > 1:
            findings["leak"].add(" = ".join(names[:2]))
        for split in {s for s, _ in group}:
            labels = {sources[split].labels[p] for s, p in group if s == split}
            if len(labels) > 1:
                findings["relabelled"].add(
                    " = ".join(n for n, (s, _) in zip(names, group) if s == split)
                )


# ---------------------------------------------------------------- the check


def open_sources(data_config):
    """The TreeSplit or RecordSplit of each split there is; DataError when there is none."""
    root, fmt = image_root_folder(data_config.image_root), data_config.format
    if fmt == "folder":
        present = [s for s in SPLITS if os.path.isdir(os.path.join(root, s))]
        if not present:
            raise DataError(f"{root}: holds no train/ or val/ folder (expected <split>/<class>/)")
        return {s: TreeSplit.scan(root, s) for s in present}
    present = [s for s in SPLITS if os.path.isfile(records.record_paths(root, s, fmt)[0])]
    if not present:
        raise DataError(f"{root}: holds no {fmt} record files; {records.MAKE_HINT}")
    classes = tuple(read_class_index(os.path.join(root, CLASSES_FILE)))
    return {s: RecordSplit(s, fmt, classes, *records.record_files(root, s, fmt)) for s in present}


def fast_pass(sources, image_root, fmt, crop_size):
    """(Result, Survey) of the fast pass over ``sources`` ({split: TreeSplit or RecordSplit})."""
    start = time.perf_counter()
    findings = new_findings(crop_size, fmt)
    survey = Survey(crop_size, findings)
    for source in sources.values():
        for folder in getattr(source, "empty", ()):
            findings["empty_class"].add(os.path.relpath(folder, image_root))
        for path in getattr(source, "ignored", ()):
            findings["ignored"].add(os.path.relpath(path, image_root))
        survey.read(source)
    splits = {
        name: split_counts(source, survey.per_class[name]) for name, source in sources.items()
    }
    missing_classes(sources, splits, findings)
    for name, split in splits.items():
        if split.get("imbalance", 0) >= IMBALANCE_FINDING:
            findings["imbalance"].add(f"{name} {split['imbalance']:.0f}:1")
    read_duplicates(sources, same_images(sources, survey.keys), findings)
    readable = survey.images - sum(map(len, survey.broken.values()))
    if readable and survey.gray == readable:
        findings["gray"] = dataclasses.replace(
            findings["gray"],
            noun="image",
            text="all {count} are grayscale (DALI decodes them to RGB, the gray in all three "
            "channels)",
            serious=False,
        )
    result = Result(
        image_root,
        fmt,
        crop_size,
        splits,
        findings,
        survey.images,
        time.perf_counter() - start,
    )
    return result, survey


def missing_classes(sources, splits, findings):
    """Classes a split lacks: a class folder the other split has (an image tree), or a
    class of classes.json without a record."""
    names = set().union(*(source.classes for source in sources.values()))
    for split, source in sources.items():
        if isinstance(source, TreeSplit):
            absent = sorted(names - set(source.classes))
        else:
            absent = [name for name, count in splits[split]["per_class"].items() if not count]
        for name in absent:
            findings["missing_class"].add(f"{name} (not in {split})")


def decode_pass(sources, survey, num_threads):
    """Decode every image the fast pass found readable with DALI on ``num_threads``
    threads; the failures become findings; returns the pass's figures."""
    threads = num_threads or available_cores()
    decoded = [0]

    def samples():
        for split, source in sources.items():
            for position, image in source.encoded(set(survey.broken[split])):
                decoded[0] += 1
                yield (split, position), image

    start = time.perf_counter()
    for split, position in undecodable(samples(), threads):
        survey.findings["undecodable"].add(sources[split].name(position))
    seconds = time.perf_counter() - start
    return {
        "images": decoded[0],
        "threads": threads,
        "seconds": round(seconds, 3),
        "images_per_second": round(decoded[0] / max(seconds, 1e-9), 1),
    }


def missing_splits(sources, data_config, findings):
    """A split without its folder or record file, or without a class folder."""
    for split in SPLITS:
        if split not in sources:
            findings["missing_split"].add(
                f"{split}/"
                if data_config.format == "folder"
                else records.record_paths(data_config.image_root, split, data_config.format)[0]
            )
        elif not sources[split].classes:
            findings["missing_split"].add(f"{split}/ (no class folders)")


def report(config):
    """paddle-resnet-check-data: the fast pass (and with --decode the decode) over
    ``config.data``'s image tree or record files; prints its lines, writes --json;
    returns the exit status: 0 clean, 1 findings."""
    data, start = config.data, time.perf_counter()
    sources = open_sources(data)
    result, survey = fast_pass(sources, data.image_root, data.format, data.crop_size)
    result.seconds = time.perf_counter() - start  # the scan of the folders included
    missing_splits(sources, data, survey.findings)
    if config.check.decode:
        result.decode = decode_pass(sources, survey, data.num_threads)
    print("\n".join(result.lines()))
    if config.check.json_path:
        with atomic_files(config.check.json_path) as (handle,):
            handle.write(json.dumps(result.as_dict(), indent=1).encode())
    return result.status
