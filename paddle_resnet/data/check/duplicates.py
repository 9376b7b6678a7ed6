"""The data check's search for the same image twice: the survey's keys (each file's size
and first 4 KB) find the candidates, a hash of the whole confirms; the groups found are a
leak (train and val) or a relabelled image (two classes of a split)."""

import hashlib

import numpy as np

from paddle_resnet.data.folder import file_reading_pool


def full_digest(source, position):
    return hashlib.blake2b(source.content(position), digest_size=16).digest()


def same_images(sources, keys):
    """Groups of (split, position) holding the same bytes."""
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
