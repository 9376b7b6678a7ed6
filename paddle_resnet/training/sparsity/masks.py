"""ASP in a training run: which layers stay dense, pruning after the weights are loaded,
a per-layer table, and verification that the pattern holds after every epoch. On both
IRs the program holds a mask variable per prunable weight; pruning computes the masks
(``pattern.prune_mask``) and writes mask and pruned weight into the scope."""

import numpy as np
import paddle

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.training import ir
from paddle_resnet.training.sparsity.pattern import (
    MASK_SUFFIX,
    NVIDIA_2_4,
    SparsityViolation,
    density,
    holds,
    is_pruning_mask,
    prune_mask,
    record,
)

# The pattern --asp prunes to, keeps and checks.
PATTERN = NVIDIA_2_4


def excluded_parameters(model, exclude):
    """Parameter names of the layers ``exclude`` names (model paths, parameter names)."""
    named = list(model.named_parameters())
    chosen = []
    for wanted in dict.fromkeys(exclude):  # each once, in order
        matches = [
            param.name
            for path, param in named
            if path == wanted or path.startswith(wanted + ".") or param.name == wanted
        ]
        if not matches:
            raise ConfigError(
                f"asp.exclude (--asp-exclude): {wanted!r} matches no layer of "
                f"{type(model).__name__}; layer paths look like 'fc' or "
                "'layer4.2.conv3'"
            )
        chosen.extend(matches)
    return chosen


def _scope_array(name):
    variable = paddle.static.global_scope().find_var(name)
    return None if variable is None else np.array(variable.get_tensor())


def _masked(program):
    """{name: parameter} of ``program``'s weights with a mask variable in it (not in the
    scope: an earlier program's masks are not this one's)."""
    names = ir.persistable_names(program)
    return {p.name: p for p in ir.parameters(program) if p.name + MASK_SUFFIX in names}


def _mask(param_name):
    return _scope_array(param_name + MASK_SUFFIX)


def layer_table(programs):
    layer_of = {param.name: path for path, param in programs.model.named_parameters()}
    rows = []
    masked = _masked(programs.train)
    for param in ir.parameters(programs.train):
        if len(param.shape) < 2 or param.name.endswith(MASK_SUFFIX):
            continue
        if param.name in masked and is_pruning_mask(_mask(param.name)):
            status = "pruned"
        elif param.name not in masked:
            status = "excluded (kept dense by configuration)"
        else:
            status = f"dense (too few input channels for {PATTERN})"
        rows.append(
            {
                "param": param.name,
                "layer": layer_of.get(param.name, ""),
                "shape": list(param.shape),
                "status": status,
                "density": round(density(_scope_array(param.name)), 4),
            }
        )
    return rows


def enforce_masks(main, startup):
    """Fleet's ASP after ``minimize`` where Fleet cannot (with QAT, frozen stages):
    Paddle's own ``ASPHelper`` steps."""
    paddle_internals.insert_asp_masks(main, startup, prunable_shapes(ir.parameters(main)))


def prunable_shapes(parameters):
    """The convolution and fully connected weights of ``parameters``, trained or frozen."""
    return [p for p in parameters if len(p.shape) in (2, 4)]


def masks_from_weights(program, place):
    """For 2:4 weights that came without their masks (a file from elsewhere): the zeros
    become the mask, so training keeps the file's pattern."""
    scope = paddle.static.global_scope()
    for param in _masked(program).values():
        mask = _mask(param.name)
        if is_pruning_mask(mask):
            continue
        weight = _scope_array(param.name)
        if holds(weight, PATTERN):
            scope.find_var(param.name + MASK_SUFFIX).get_tensor().set(
                (weight != 0).astype(mask.dtype), place
            )


def sparsity_record(program):
    """``pattern.record`` of ``program``'s pruned weights, for a checkpoint's meta.json."""
    return record(PATTERN, [name for name in _masked(program) if is_pruning_mask(_mask(name))])


def prune(program, mask_algo, place):
    """Each masked weight of ``program`` pruned by ``mask_algo``, into the scope."""
    scope = paddle.static.global_scope()
    for param in _masked(program).values():
        weight = _scope_array(param.name)
        mask = prune_mask(weight, mask_algo, PATTERN)
        scope.find_var(param.name + MASK_SUFFIX).get_tensor().set(mask, place)
        scope.find_var(param.name).get_tensor().set(weight * mask, place)


def prepare(programs, asp_config, report, resumed, place):
    """Prune after the weights are loaded (unless ``resumed``); the layer table."""
    pruning = asp_config.prune_model and not resumed
    if pruning:
        prune(programs.train, asp_config.mask_algo, place)
    elif not resumed:
        masks_from_weights(programs.train, place)
    rows = layer_table(programs)
    if not any(row["status"] == "pruned" for row in rows):
        raise ConfigError(
            f"--asp without --prune-model continues a model that is already {PATTERN} "
            "sparse (an ASP checkpoint); these weights are dense: add "
            f"--prune-model (it keeps the zeros of weights that are already {PATTERN})"
        )
    report.log("ASP", {"layers": rows}, kind="PARAMETER", console=False)
    report.print(f"asp: {'layer':34s} {'shape':20s} density  status")
    for row in rows:
        report.print(
            f"asp: {row['layer'] or row['param']:34s} {str(row['shape']):20s} "
            f"{row['density']:.3f}    {row['status']}"
        )
    verify(programs, report, where="after pruning" if pruning else "at start")


def verify(programs, report, where):
    """Raise unless every masked weight holds ``PATTERN`` with its mask's zeros."""
    checked = 0
    for param in _masked(programs.train).values():
        mask = _mask(param.name)
        if not is_pruning_mask(mask):
            continue
        weight = _scope_array(param.name)
        if not holds(weight, PATTERN) or np.any(weight[mask == 0] != 0):
            raise SparsityViolation(f"{param.name} lost its {PATTERN} pattern {where}")
        checked += 1
    report.print(f"asp: {checked} weights hold the {PATTERN} pattern {where}")
