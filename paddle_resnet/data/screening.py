"""One screening of a training run's image tree per job start: which files no decoder can
read (DALI's CPU decoder can crash the process on them, ``folder.structurally_broken``),
handed to the loaders on the run's splits (``DataSplit.broken``), and, with the data check
(``check.at_start`` config key), what the check finds.

Rank 0 reads every image's header once, or takes the result it cached beside the run
(``<output-dir>/data_check.json``) when each file has the same name, size and modification
time (a file rewritten in place within the file system's time resolution and at the same
size is not noticed: delete the cache to screen again). Every other rank takes rank 0's
result (``share``: the job's key-value store) instead of reading 1.3 M headers of its own.
"""

import dataclasses
import hashlib
import json
import os
import time
from typing import Dict, List, Optional

from paddle_resnet.core import provenance
from paddle_resnet.core.atomic import atomic_files
from paddle_resnet.data.check import fast_pass
from paddle_resnet.data.check.sources import TreeSplit
from paddle_resnet.data.folder import CHUNK, file_reading_pool, read_headers, refuse_broken

CACHE_FILE = "data_check.json"


@dataclasses.dataclass
class Screening:
    """The positions of each split's broken files, and the data check's lines and record."""

    broken: Dict[str, List[int]]
    lines: List[str]
    record: Optional[dict]
    cached: bool = False


def fingerprint(config, splits):
    """A digest of each file's name, size and modification time (stat, in parallel), the
    crop size, whether the check runs, and the toolkit's version."""
    digest = hashlib.blake2b(digest_size=16)
    code = provenance.code()
    digest.update(f"{code['toolkit']} {config.data.crop_size} {config.check.at_start}".encode())
    for split in splits:
        files = split.image_list.files
        chunks = [files[i : i + CHUNK] for i in range(0, len(files), CHUNK)]
        with file_reading_pool() as pool:
            for stats in pool.map(_stats, chunks):
                digest.update(os.fsencode(stats))  # a name that is not UTF-8 as its bytes
    return digest.hexdigest()


def _stats(paths):
    lines = []
    for path in paths:
        try:
            found = os.stat(path)
            lines.append(f"{path}\0{found.st_size}\0{found.st_mtime_ns}\n")
        except OSError as err:  # the header pass says what is wrong with it
            lines.append(f"{path}\0{err.errno}\n")
    return "".join(lines)


def screen(config, splits):
    """Rank 0's ``Screening`` of ``splits``, from the cache of an unchanged tree or read."""
    cache = os.path.join(config.run.output_dir, CACHE_FILE)
    key = fingerprint(config, splits)
    cached = _read_cache(cache, key)
    if cached:
        return cached
    start = time.perf_counter()
    if config.check.at_start:
        root = config.data.image_root
        sources = {
            s.split: TreeSplit(
                s.split, root, s.classes, list(s.image_list.files), list(s.image_list.labels)
            )
            for s in splits
        }
        result, survey = fast_pass(sources, root, "folder", config.data.crop_size)
        screening = Screening(survey.broken, result.start_lines(), result.as_dict())
    else:
        broken = {
            s.split: [p for p, h in enumerate(read_headers(s.image_list.files)) if h.problem]
            for s in splits
        }
        screening = Screening(broken, [], None)
    seconds = time.perf_counter() - start
    with atomic_files(cache) as (handle,):
        entry = {"fingerprint": key, "seconds": seconds, "screening": dataclasses.asdict(screening)}
        handle.write(json.dumps(entry).encode())
    return screening


def _read_cache(path, key):
    """The cached Screening of the tree whose fingerprint is ``key``, or None."""
    try:
        with open(path, "rb") as handle:
            entry = json.loads(handle.read())
        screening = Screening(**entry["screening"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or not ours
        return None
    if entry.get("fingerprint") != key:
        return None
    if screening.lines:
        screening.lines[0] += (
            f" (the result of an earlier start: the tree is unchanged; {CACHE_FILE})"
        )
    return dataclasses.replace(screening, cached=True)


def screening_problem(value, splits):
    """Why ``value``, rank 0's screening read from the job's store, cannot be this rank's
    (``dataclasses.asdict`` of a ``Screening`` of ``splits``), or None."""
    names = [f.name for f in dataclasses.fields(Screening)]
    if not isinstance(value, dict) or sorted(value) != sorted(names):
        return f"not a screening (a mapping of {', '.join(names)})"
    sizes = {split.split: len(split.image_list.files) for split in splits}
    broken = value["broken"]
    if not isinstance(broken, dict) or sorted(broken) != sorted(sizes):
        return f"its broken files are not given by split ({', '.join(sizes)})"
    for split, positions in broken.items():
        if not isinstance(positions, list) or not all(
            type(p) is int and 0 <= p < sizes[split] for p in positions
        ):
            return f"its broken files of {split} are not positions among its {sizes[split]} images"
    lines, record = value["lines"], value["record"]
    if not (isinstance(lines, list) and all(isinstance(line, str) for line in lines)):
        return "its lines are not a list of text"
    if not (record is None or isinstance(record, dict)) or type(value["cached"]) is not bool:
        return "its record is not a mapping, or its cached flag not true or false"
    return None


def screened(config, train_split, val_split, rank, share):
    """(the run's ``Screening``, None for record files; the train and val splits carrying
    their broken files), the same on every rank: rank 0 screens, ``share`` gives it to all."""
    splits = [s for s in (train_split, val_split) if s is not None and s.image_list is not None]
    if not splits:
        return None, train_split, val_split
    mine = dataclasses.asdict(screen(config, splits)) if rank == 0 else None
    shared = share("screening", mine, check=lambda value: screening_problem(value, splits))
    screening = Screening(**shared)
    handed = {
        split.split: split.with_broken(
            split.image_list.files[position] for position in screening.broken[split.split]
        )
        for split in splits
    }
    if config.check.at_start:
        refuse_broken([path for split in handed.values() for path in split.broken])
    return screening, handed.get("train", train_split), handed.get("val", val_split)
