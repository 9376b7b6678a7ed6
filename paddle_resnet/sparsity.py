"""2:4 structured sparsity (ASP): pruning, a per-layer table, and verification.

Pattern checked here, the one Paddle's ASP and cuSPARSELt use: in every group of
4 consecutive weights along the input dimension at least 2 are zero. Conv weights
are [out, in, kh, kw] (groups run along ``in``); FC weights are [in, out] (groups
run along ``in``, the first axis).
"""
import os

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


def is_pruning_mask(mask):
    """ASP creates a mask for every supported layer, but leaves it all ones where the
    weight cannot hold 2:4 (fewer than 4 input channels)."""
    return mask is not None and not np.all(np.asarray(mask) != 0)


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
        if len(param.shape) < 2 or param.name.endswith(MASK_SUFFIX):
            continue
        weight = _scope_array(param.name)
        if is_pruning_mask(_scope_array(param.name + MASK_SUFFIX)):
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
    report.print(f"asp: {'layer':34s} {'shape':20s} density  status")
    for row in rows:
        report.print(f"asp: {row['layer'] or row['param']:34s} {str(row['shape']):20s} "
                     f"{row['density']:.3f}    {row['status']}")
    verify(programs, report, where="after pruning" if asp_config.prune_model else "at start")


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


def sparse_parameters(state):
    """Names of the weights a checkpoint marks as sparse (saved with a pruning ASP mask)."""
    return sorted(name[: -len(MASK_SUFFIX)] for name, value in state.items()
                  if name.endswith(MASK_SUFFIX) and is_pruning_mask(value))


def read_inference_params(model_dir):
    """Parameter name -> array of an exported inference model."""
    import paddle

    from paddle_resnet.predictor import MODEL_FILE

    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        program, _, _ = paddle.static.load_inference_model(
            os.path.join(model_dir, MODEL_FILE.rsplit(".", 1)[0]), exe)
        return {var.name: np.array(scope.find_var(var.name).get_tensor())
                for var in program.list_vars()
                if var.persistable and var.name not in ("feed", "fetch")}


def check_inference_model(model_dir, names):
    """Raise if any of ``names`` lost the 2:4 pattern in the exported parameters."""
    params = read_inference_params(model_dir)
    broken = [name for name in names if name not in params or not is_2to4(params[name])]
    if broken:
        raise SparsityViolation(f"{model_dir}: exported weights not 2:4 sparse: {broken[:3]}")


def compliance_table(params, marked):
    """One row per weight of ``params``: shape, density, 2:4 or not, marked sparse or not."""
    rows = []
    for name in sorted(params):
        value = np.asarray(params[name])
        if value.ndim not in (2, 4) or name.endswith(MASK_SUFFIX):
            continue
        rows.append({"param": name, "shape": list(value.shape), "density": round(density(value), 4),
                     "is_2to4": is_2to4(value), "marked_sparse": name in marked})
    return rows


def _load_for_check(path):
    """(params, names marked sparse) of a checkpoint, a .pdparams file or an inference model."""
    from paddle_resnet import checkpoint as ckpt
    from paddle_resnet.predictor import INFO_FILE, read_model_info

    if os.path.isdir(path) and os.path.exists(os.path.join(path, INFO_FILE)):
        return read_inference_params(path), set(read_model_info(path).get("sparse_2to4", []))
    if os.path.isdir(path):
        path = os.path.join(ckpt.verify_checkpoint(path)[0], ckpt.PREFIX)
    # The weights and their ASP masks; not the optimizer state of the .pdopt file.
    params = ckpt.read_state(path, optimizer=False)
    return params, set(sparse_parameters(params))


def main(argv=None):
    import argparse
    import json
    import sys

    from paddle_resnet.errors import UserError

    parser = argparse.ArgumentParser(
        prog="python -m paddle_resnet.sparsity",
        description="Report the 2:4 compliance and density of every weight of a checkpoint "
                    "folder, a .pdparams file or an exported inference model. Exit code 1 when "
                    "a weight marked sparse (saved with an ASP mask, or listed by the export) "
                    "is not 2:4.")
    parser.add_argument("path")
    parser.add_argument("--json", help="also write the table to this JSON file")
    args = parser.parse_args(argv)
    try:
        params, marked = _load_for_check(args.path)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = compliance_table(params, marked)
    for row in rows:
        verdict = "2:4" if row["is_2to4"] else "dense"
        flag = "  <-- marked sparse but NOT 2:4" if row["marked_sparse"] and not row["is_2to4"] else ""
        print(f"{row['param']:32s} {str(row['shape']):22s} density {row['density']:.3f} "
              f"{verdict:5s} {'sparse' if row['marked_sparse'] else ''}{flag}")
    failures = [r["param"] for r in rows if r["marked_sparse"] and not r["is_2to4"]]
    print(f"{sum(r['marked_sparse'] for r in rows)} weights marked sparse, "
          f"{len(failures)} violate 2:4, {sum(r['is_2to4'] for r in rows)} of {len(rows)} are 2:4")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"path": args.path, "layers": rows, "violations": failures}, handle, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
