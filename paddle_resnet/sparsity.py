"""2:4 structured sparsity (ASP): pruning, a per-layer table, and verification.

Pattern checked here, the one Paddle's ASP and cuSPARSELt use: in every group of
4 consecutive weights along the input dimension at least 2 are zero. Conv weights
are [out, in, kh, kw] (groups run along ``in``); FC weights are [in, out] (groups
run along ``in``, the first axis).
"""
import numpy as np

MASK_SUFFIX = ".asp_mask"


class SparsityViolation(RuntimeError):
    """A weight that should hold the 2:4 pattern does not."""


def rows_along_input(weight):
    """The weight as rows whose consecutive entries run along the input dimension."""
    weight = np.asarray(weight)
    if weight.ndim == 4:                      # conv [out, in, kh, kw]
        return weight.transpose(0, 2, 3, 1).reshape(-1, weight.shape[1])
    if weight.ndim == 2:                      # fc [in, out]
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


def _scope_array(name):
    import paddle

    variable = paddle.static.global_scope().find_var(name)
    return None if variable is None else np.array(variable.get_tensor())


def layer_table(programs):
    """One row per weight: name, layer, shape, status (pruned / excluded / dense) and density."""
    from paddle.incubate.asp import ASPHelper

    layer_of = {param.name: path for path, param in programs.model.named_parameters()}
    rows = []
    for param in programs.train.all_parameters():
        if len(param.shape) < 2:
            continue
        weight = _scope_array(param.name)
        has_mask = _scope_array(param.name + MASK_SUFFIX) is not None
        if has_mask:
            status = "pruned"
        elif not ASPHelper._is_supported_layer(programs.train, param.name):
            status = "excluded (kept dense by configuration)"
        else:
            status = "dense (too few input channels for 2:4)"
        rows.append({"param": param.name, "layer": layer_of.get(param.name, ""),
                     "shape": list(param.shape), "status": status,
                     "density": round(density(weight), 4)})
    return rows


def prepare(programs, asp_config, exe, place, report):
    """Prune (with ``prune_model``) after the weights are loaded; report the layer table."""
    from paddle.incubate import asp

    if asp_config.prune_model:
        asp.prune_model(programs.train, mask_algo=asp_config.mask_algo, with_mask=True)
    rows = layer_table(programs)
    report.log("ASP", {"layers": rows}, kind="PARAMETER", console=False)
    for row in rows:
        report.print(f"  asp {row['status'][:8]:8s} {row['density']:.3f} {row['layer'] or row['param']} "
                     f"{row['shape']}")
    verify(programs, report, where="after pruning" if asp_config.prune_model else "at start")


def verify(programs, report, where):
    """Every masked weight still holds 2:4 with its zeros where its mask says; raise if not."""
    checked = 0
    for param in programs.train.all_parameters():
        mask = _scope_array(param.name + MASK_SUFFIX)
        if mask is None:
            continue
        weight = _scope_array(param.name)
        if not is_2to4(weight) or np.any(weight[mask == 0] != 0):
            raise SparsityViolation(f"{param.name} lost its 2:4 pattern {where}")
        checked += 1
    report.print(f"asp: {checked} weights hold the 2:4 pattern {where}")
