"""The data check: what an image tree (or its record files) holds, and what in it training
would refuse, skip or change without a word, found before hours of training.

    paddle-resnet-check-data --image-root DIR [--config NAME] [--decode] [--json FILE]

Per split: the classes and the images per class; then one line per kind of finding
(``findings.CATALOGUE``) with a count and up to three examples. Notes say what the
pipeline does with a property the whole set shares; they are not findings.

Two depths. The fast pass reads each file's header (no decode; a JPEG's end marker) and
hashes its size with its first 4 KB: only files whose keys agree can be the same image,
and only those are hashed whole to confirm. ``decode`` adds a full decode by DALI's CPU
decoder, as training decodes. A training run starts with the fast pass, once per job
(``screening.py``): its findings are warnings, broken images are refused.
"""

import json
import os
import time

from paddle_resnet.core.atomic import atomic_files
from paddle_resnet.data import records
from paddle_resnet.data.check.decoding import decode_pass
from paddle_resnet.data.check.duplicates import read_duplicates, same_images
from paddle_resnet.data.check.findings import ALL_GRAY, IMBALANCE_FINDING, new_findings
from paddle_resnet.data.check.result import Result, split_counts
from paddle_resnet.data.check.sources import SPLITS, TreeSplit, open_sources
from paddle_resnet.data.check.survey import Survey


def fast_pass(sources, image_root, fmt, crop_size):
    """(Result, Survey) of the fast pass over ``sources`` ({split: TreeSplit or RecordSplit})."""
    start = time.perf_counter()
    findings = new_findings(crop_size, fmt)
    survey = Survey(crop_size, findings)
    for source in sources.values():
        for folder in getattr(source, "empty", ()):
            findings["empty_class"].add(os.path.relpath(folder, image_root))
        for kind in ("ignored", "unfollowed"):  # files and links the walk skipped
            for path in getattr(source, kind, ()):
                findings[kind].add(os.path.relpath(path, image_root))
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
        findings["gray"] = findings["gray"].restated(ALL_GRAY)
    seconds = time.perf_counter() - start
    return Result(image_root, fmt, crop_size, splits, findings, survey.images, seconds), survey


def missing_classes(sources, splits, findings):
    """Classes a split lacks: the other split's, or those of classes.json without a record."""
    names = set().union(*(source.classes for source in sources.values()))
    for split, source in sources.items():
        if isinstance(source, TreeSplit):
            absent = sorted(names - set(source.classes))
        else:
            absent = [name for name, count in splits[split]["per_class"].items() if not count]
        for name in absent:
            findings["missing_class"].add(f"{name} (not in {split})")


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
    """paddle-resnet-check-data; returns the exit status: 0 clean, 1 findings."""
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
