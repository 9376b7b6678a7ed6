"""The 2:4 pattern on NumPy arrays, as Paddle's ASP and cuSPARSELt use it: in every
group of 4 consecutive weights along the input dimension at least 2 are zero.

Conv weights are [out, in, kh, kw] (groups run along ``in``); FC weights are
[in, out] (groups run along ``in``, the first axis).
"""

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
