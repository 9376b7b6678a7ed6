"""The N:M sparsity pattern on NumPy arrays, as Paddle's ASP and cuSPARSELt use it: in
every group of M consecutive weights along the input dimension at most N are nonzero.
The pattern is data (``Pattern``), which checkpoints and exports record (``record``).
Conv weights are [out, in, kh, kw], FC weights [in, out]: groups run along ``in``.
"""

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from paddle_resnet.core.config import keys
from paddle_resnet.core.errors import UserError

# ASP keeps each pruned weight's mask in a variable of this suffix.
MASK_SUFFIX = ".asp_mask"


@dataclass(frozen=True)
class Pattern:
    """At most ``kept`` nonzero weights in every ``group`` consecutive input weights."""

    kept: int
    group: int

    def __str__(self):
        return f"{self.kept}:{self.group}"

    @classmethod
    def parse(cls, text):
        kept, group = (int(part) for part in text.split(":"))
        return cls(kept, group)


# What Ampere's sparse tensor cores and Paddle's ASP run: the pattern --asp prunes to.
NVIDIA_2_4 = Pattern(kept=2, group=4)


class SparsityViolation(UserError):
    """A weight that should hold the sparsity pattern does not."""


def rows_along_input(weight):
    """The weight as rows whose consecutive entries run along the input dimension."""
    weight = np.asarray(weight)
    if weight.ndim == 4:  # conv [out, in, kh, kw]
        return weight.transpose(0, 2, 3, 1).reshape(-1, weight.shape[1])
    if weight.ndim == 2:  # fc [in, out]
        return weight.T
    raise ValueError(f"no N:M layout for a weight of shape {weight.shape}")


def holds(weight, pattern):
    """Whether every group along the input dimension holds ``pattern``."""
    rows = rows_along_input(weight)
    if rows.shape[1] % pattern.group:
        return False
    groups = rows.reshape(rows.shape[0], -1, pattern.group)
    return bool(((groups != 0).sum(axis=2) <= pattern.kept).all())


def density(weight):
    weight = np.asarray(weight)
    return float(np.count_nonzero(weight)) / weight.size


def is_pruning_mask(mask):
    """ASP creates a mask for every supported layer, but leaves it all ones where the
    weight cannot hold the pattern (fewer input channels than a group)."""
    return mask is not None and not np.all(np.asarray(mask) != 0)


def sparse_parameters(state):
    """The weights a checkpoint saved with a pruning ASP mask."""
    return sorted(
        name[: -len(MASK_SUFFIX)]
        for name, value in state.items()
        if name.endswith(MASK_SUFFIX) and is_pruning_mask(value)
    )


def record(pattern, names):
    """What meta.json and model.json say of their sparsity; None without sparse weights."""
    return {"pattern": str(pattern), "weights": sorted(names)} if names else None


def recorded(meta, state):
    """The sparsity ``record`` of start weights, in the pattern their meta.json names (a
    file without one was pruned by the toolkit: ``NVIDIA_2_4``)."""
    saved = (meta or {}).get("sparsity")
    pattern = Pattern.parse(saved["pattern"]) if saved else NVIDIA_2_4
    return record(pattern, sparse_parameters(state))


def compliance_table(params, marked, pattern):
    """One row per weight of ``params``: shape, density, pattern held, marked sparse."""
    rows = []
    for name in sorted(params):
        value = np.asarray(params[name])
        if value.ndim not in (2, 4) or name.endswith(MASK_SUFFIX):
            continue
        rows.append(
            {
                "param": name,
                "shape": list(value.shape),
                "density": round(density(value), 4),
                "holds_pattern": holds(value, pattern),
                "marked_sparse": name in marked,
            }
        )
    return rows


# The mask algorithms: the toolkit's own, for PIR (no ASP there). Each gives the mask
# ``paddle.incubate.asp`` gives (tested): the same layout as rows, orderings and
# tie-breaks, so checkpoints pruned on either IR look alike.


def paddle_rows(weight):
    """The weight as ASP lays it out: conv -> rows (kw, kh, out) x in; fc -> out x in."""
    t = np.asarray(weight, dtype=float).T
    if t.ndim == 4:  # [kw, kh, in, out]
        return t.transpose(0, 1, 3, 2).reshape(-1, t.shape[2])
    return t


def from_paddle_rows(rows, shape):
    """Inverse of ``paddle_rows`` for a weight of ``shape``."""
    if len(shape) == 4:
        out, cin, kh, kw = shape
        return rows.reshape(kw, kh, out, cin).transpose(0, 1, 3, 2).T
    return rows.T


def _padded(rows, rows_multiple, cols_multiple):
    """``rows`` zero-padded to multiples of the given sizes (ASP pads the same way)."""
    multiples = (rows_multiple, cols_multiple)
    padded = np.zeros([-(-size // m) * m for size, m in zip(rows.shape, multiples)])
    padded[: rows.shape[0], : rows.shape[1]] = rows
    return padded


def mask_1d(rows, pattern):
    """In each group along a row, the smallest magnitudes masked: all but ``kept``."""
    group = pattern.group
    groups = _padded(rows, 1, group).reshape(-1, group)
    mask = np.ones_like(groups)
    smallest = np.argsort(np.absolute(groups), axis=1)[:, : group - pattern.kept]
    np.put_along_axis(mask, smallest, 0.0, axis=1)
    return mask.reshape(rows.shape[0], -1)[:, : rows.shape[1]]


def _blocks(rows, size):
    """(size x size blocks of ``rows`` as [count, size**2], row-major; padded shape)."""
    padded = _padded(rows, size, size)
    r, c = padded.shape
    blocks = padded.reshape(r // size, size, c // size, size).transpose(0, 2, 1, 3)
    return blocks.reshape(-1, size * size), padded.shape


def _unblocks(blocks, shape, rows, size):
    r, c = shape
    full = blocks.reshape(r // size, c // size, size, size).transpose(0, 2, 1, 3).reshape(r, c)
    return full[: rows.shape[0], : rows.shape[1]]


def mask_2d_greedy(rows, pattern):
    """In each group x group block, magnitudes kept largest first while their row and
    column have fewer than ``kept`` kept: the pattern holds along both."""
    size, kept = pattern.group, pattern.kept
    blocks, shape = _blocks(rows, size)
    order = np.argsort(np.absolute(blocks), axis=1)
    mask = np.zeros_like(blocks)
    kept_in_row = np.zeros((len(blocks), size), dtype=int)
    kept_in_col = np.zeros((len(blocks), size), dtype=int)
    index = np.arange(len(blocks))
    for position in range(size * size - 1, -1, -1):
        entry = order[:, position]
        row, col = entry // size, entry % size
        free = (kept_in_row[index, row] < kept) & (kept_in_col[index, col] < kept)
        mask[index[free], entry[free]] = 1.0
        kept_in_row[index[free], row[free]] += 1
        kept_in_col[index[free], col[free]] += 1
    return _unblocks(mask, shape, rows, size)


@functools.lru_cache(maxsize=None)
def valid_2d_patterns(pattern):
    """Every group x group 0/1 block with ``kept`` ones per row and at most ``kept`` per
    column, in ASP's order (its tie-break). Grows factorially: fine for 2:4, not 4:8."""
    size, kept = pattern.group, pattern.kept
    row = np.zeros(size)
    row[:kept] = 1
    rows = list(set(itertools.permutations(row.tolist())))
    patterns = np.asarray(list(set(itertools.permutations(rows * kept, size))))
    valid = ((patterns.sum(axis=1) <= kept).sum(axis=1) == size).nonzero()[0]
    return patterns[valid]


def mask_2d_best(rows, pattern):
    """In each block, the valid 2-D pattern with the largest sum of kept values (signed,
    as Paddle's ASP sums; NVIDIA's apex sums magnitudes)."""
    blocks, shape = _blocks(rows, pattern.group)
    patterns = valid_2d_patterns(pattern)
    best = np.argmax(blocks @ patterns.reshape(len(patterns), -1).T, axis=1)
    return _unblocks(patterns[best].reshape(len(blocks), -1), shape, rows, pattern.group)


# --mask-algo's choices (core/config/keys.py), each naming its function here.
MASK_ALGOS = {name: globals()[name] for name in keys.MASK_ALGOS}


def prune_mask(weight, algo, pattern):
    """The mask of ``weight`` by ``algo``; all ones where it has fewer input channels than
    a group (ASP leaves those dense)."""
    weight = np.asarray(weight)
    inputs = weight.shape[1] if weight.ndim == 4 else weight.shape[0]
    if inputs < pattern.group:
        return np.ones_like(weight)
    mask = from_paddle_rows(MASK_ALGOS[algo](paddle_rows(weight), pattern), weight.shape)
    return mask.astype(weight.dtype)
