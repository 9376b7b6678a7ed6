"""The 2:4 pattern on NumPy arrays, as Paddle's ASP and cuSPARSELt use it: in every
group of 4 consecutive weights along the input dimension at least 2 are zero.

Conv weights are [out, in, kh, kw] (groups run along ``in``); FC weights are
[in, out] (groups run along ``in``, the first axis).
"""

import functools
import itertools

import numpy as np

from paddle_resnet.core.errors import UserError

# ASP keeps each pruned weight's mask in a variable of this suffix.
MASK_SUFFIX = ".asp_mask"


class SparsityViolation(UserError):
    """A weight that should hold the 2:4 pattern does not."""


def rows_along_input(weight):
    """The weight as rows whose consecutive entries run along the input dimension."""
    weight = np.asarray(weight)
    if weight.ndim == 4:  # conv [out, in, kh, kw]
        return weight.transpose(0, 2, 3, 1).reshape(-1, weight.shape[1])
    if weight.ndim == 2:  # fc [in, out]
        return weight.T
    raise ValueError(f"no 2:4 layout for a weight of shape {weight.shape}")


def is_2to4(weight):
    """True when every group of 4 along the input dimension has at least 2 zeros."""
    rows = rows_along_input(weight)
    if rows.shape[1] % 4:
        return False
    groups = rows.reshape(rows.shape[0], -1, 4)
    return bool(((groups != 0).sum(axis=2) <= 2).all())


def density(weight):
    weight = np.asarray(weight)
    return float(np.count_nonzero(weight)) / weight.size


def is_pruning_mask(mask):
    """ASP creates a mask for every supported layer, but leaves it all ones where the
    weight cannot hold 2:4 (fewer than 4 input channels)."""
    return mask is not None and not np.all(np.asarray(mask) != 0)


def sparse_parameters(state):
    """Names of the weights a checkpoint marks as sparse (saved with a pruning ASP mask)."""
    return sorted(
        name[: -len(MASK_SUFFIX)]
        for name, value in state.items()
        if name.endswith(MASK_SUFFIX) and is_pruning_mask(value)
    )


def check_sparse(params, names, where):
    """Raise SparsityViolation if any of ``names`` is missing from ``params`` or not 2:4."""
    broken = [name for name in names if name not in params or not is_2to4(params[name])]
    if broken:
        raise SparsityViolation(f"{where}: weights not 2:4 sparse: {broken[:3]}")


def compliance_table(params, marked):
    """One row per weight of ``params``: shape, density, 2:4 or not, marked sparse or not."""
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
                "is_2to4": is_2to4(value),
                "marked_sparse": name in marked,
            }
        )
    return rows


# ---------------------------------------------------------------- mask algorithms
# The toolkit's own, for the IR where Paddle has no ASP (PIR). Each gives, for the same
# weights, the mask ``paddle.incubate.asp`` gives (tested): the same layout of a weight
# as rows (``paddle_rows``), the same orderings and the same tie-breaks, so checkpoints
# pruned on either IR look alike. Masks are float arrays of the weight's shape.

N, M = 2, 4


def paddle_rows(weight):
    """The weight as ASP lays it out before masking (cuSPARSELt prunes along the input
    dimension): conv [out, in, kh, kw] -> rows (kw, kh, out) x in; fc [in, out] -> out x in."""
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
    padded = np.zeros(
        (
            -(-rows.shape[0] // rows_multiple) * rows_multiple,
            -(-rows.shape[1] // cols_multiple) * cols_multiple,
        )
    )
    padded[: rows.shape[0], : rows.shape[1]] = rows
    return padded


def mask_1d(rows):
    """In each group of 4 along a row, the 2 smallest magnitudes masked."""
    groups = _padded(rows, 1, M).reshape(-1, M)
    mask = np.ones_like(groups)
    smallest = np.argsort(np.absolute(groups), axis=1)[:, :N]
    np.put_along_axis(mask, smallest, 0.0, axis=1)
    return mask.reshape(rows.shape[0], -1)[:, : rows.shape[1]]


def _blocks(rows):
    """(4x4 blocks of ``rows`` as [count, 16], padded shape), row-major block order."""
    padded = _padded(rows, M, M)
    r, c = padded.shape
    blocks = padded.reshape(r // M, M, c // M, M).transpose(0, 2, 1, 3).reshape(-1, M * M)
    return blocks, padded.shape


def _unblocks(blocks, shape, rows):
    r, c = shape
    full = blocks.reshape(r // M, c // M, M, M).transpose(0, 2, 1, 3).reshape(r, c)
    return full[: rows.shape[0], : rows.shape[1]]


def mask_2d_greedy(rows):
    """In each 4x4 block, magnitudes kept largest first while their row and column have
    fewer than 2 kept: at least 2 zeros in every row and column of the block."""
    blocks, shape = _blocks(rows)
    order = np.argsort(np.absolute(blocks), axis=1)
    mask = np.zeros_like(blocks)
    kept_in_row = np.zeros((len(blocks), M), dtype=int)
    kept_in_col = np.zeros((len(blocks), M), dtype=int)
    index = np.arange(len(blocks))
    for position in range(M * M - 1, -1, -1):
        entry = order[:, position]
        row, col = entry // M, entry % M
        free = (kept_in_row[index, row] < N) & (kept_in_col[index, col] < N)
        mask[index[free], entry[free]] = 1.0
        kept_in_row[index[free], row[free]] += 1
        kept_in_col[index[free], col[free]] += 1
    return _unblocks(mask, shape, rows)


@functools.lru_cache(maxsize=1)
def valid_2d_patterns():
    """Every 4x4 0/1 pattern with 2 ones per row and at most 2 per column, in the order
    ASP enumerates them (its tie-break between equally good patterns)."""
    row = np.zeros(M)
    row[:N] = 1
    rows = list(set(itertools.permutations(row.tolist())))
    patterns = np.asarray(list(set(itertools.permutations(rows + rows, M))))
    valid = ((patterns.sum(axis=1) <= N).sum(axis=1) == M).nonzero()[0]
    return patterns[valid]


def mask_2d_best(rows):
    """In each 4x4 block, the valid 2-D pattern with the largest sum of kept values. As
    in Paddle's ASP the sum is of the signed values (NVIDIA's apex sums magnitudes)."""
    blocks, shape = _blocks(rows)
    patterns = valid_2d_patterns()
    best = np.argmax(blocks @ patterns.reshape(len(patterns), -1).T, axis=1)
    return _unblocks(patterns[best].reshape(len(blocks), -1), shape, rows)


MASK_ALGOS = {"mask_1d": mask_1d, "mask_2d_greedy": mask_2d_greedy, "mask_2d_best": mask_2d_best}


def prune_mask(weight, algo):
    """The 2:4 mask of ``weight`` (conv or fc) by ``algo``; all ones where the input
    dimension has fewer than 4 channels (ASP leaves those dense)."""
    weight = np.asarray(weight)
    inputs = weight.shape[1] if weight.ndim == 4 else weight.shape[0]
    if inputs < M:
        return np.ones_like(weight)
    mask = from_paddle_rows(MASK_ALGOS[algo](paddle_rows(weight)), weight.shape)
    return mask.astype(weight.dtype)
