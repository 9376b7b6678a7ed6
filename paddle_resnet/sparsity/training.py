"""ASP in a training run: which layers stay dense, pruning after the weights are loaded,
a per-layer table, and verification that the pattern holds after every epoch."""
import numpy as np
import paddle
from paddle.incubate import asp

from paddle_resnet.errors import ConfigError
from paddle_resnet.sparsity.pattern import (MASK_SUFFIX, SparsityViolation, density, is_2to4,
                                            is_pruning_mask)


def excluded_parameters(model, exclude):
    """Parameter names of the layers ``exclude`` names (model paths such as ``fc`` or
    ``layer4.2.conv3``, or parameter names); each name must match something."""
    named = list(model.named_parameters())
    chosen = []
    for wanted in exclude:
        matches = [param.name for path, param in named
                   if path == wanted or path.startswith(wanted + ".") or param.name == wanted]
        if not matches:
            raise ConfigError(f"asp.exclude (--asp-exclude): {wanted!r} matches no layer of "
                              f"{type(model).__name__}; layer paths look like 'fc' or "
                              "'layer4.2.conv3'")
        chosen.extend(matches)
    return chosen


def _scope_array(name):
    variable = paddle.static.global_scope().find_var(name)
    return None if variable is None else np.array(variable.get_tensor())


def layer_table(programs):
    """One row per weight: name, layer, shape, status (pruned / excluded / dense) and density."""
    layer_of = {param.name: path for path, param in programs.model.named_parameters()}
    rows = []
    for param in programs.train.all_parameters():
        if len(param.shape) < 2 or param.name.endswith(MASK_SUFFIX):
            continue
        if is_pruning_mask(_scope_array(param.name + MASK_SUFFIX)):
            status = "pruned"
        elif not asp.ASPHelper._is_supported_layer(programs.train, param.name):
            status = "excluded (kept dense by configuration)"
        else:
            status = "dense (too few input channels for 2:4)"
        rows.append({"param": param.name, "layer": layer_of.get(param.name, ""),
                     "shape": list(param.shape), "status": status,
                     "density": round(density(_scope_array(param.name)), 4)})
    return rows


def prepare(programs, asp_config, report, resumed):
    """Prune (with ``prune_model``, unless ``resumed``: the checkpoint's masks were
    restored) after the weights are loaded; report the layer table."""
    prune = asp_config.prune_model and not resumed
    if prune:
        asp.prune_model(programs.train, mask_algo=asp_config.mask_algo, with_mask=True)
    rows = layer_table(programs)
    if not any(row["status"] == "pruned" for row in rows):
        raise ConfigError("--asp without --prune-model continues a model that is already 2:4 "
                          "sparse (an ASP checkpoint); these weights are dense: add "
                          "--prune-model (it keeps the zeros of weights that are already 2:4)")
    report.log("ASP", {"layers": rows}, kind="PARAMETER", console=False)
    report.print(f"asp: {'layer':34s} {'shape':20s} density  status")
    for row in rows:
        report.print(f"asp: {row['layer'] or row['param']:34s} {str(row['shape']):20s} "
                     f"{row['density']:.3f}    {row['status']}")
    verify(programs, report, where="after pruning" if prune else "at start")


def verify(programs, report, where):
    """Every masked weight still holds 2:4 with its zeros where its mask says; raise if not."""
    checked = 0
    for param in programs.train.all_parameters():
        mask = _scope_array(param.name + MASK_SUFFIX)
        if not is_pruning_mask(mask):
            continue
        weight = _scope_array(param.name)
        if not is_2to4(weight) or np.any(weight[mask == 0] != 0):
            raise SparsityViolation(f"{param.name} lost its 2:4 pattern {where}")
        checked += 1
    report.print(f"asp: {checked} weights hold the 2:4 pattern {where}")
