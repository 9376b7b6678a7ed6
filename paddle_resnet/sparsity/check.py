"""``python -m paddle_resnet.sparsity PATH``: the 2:4 compliance and density of every
weight of a checkpoint folder, a .pdparams file or an exported inference model."""
import argparse
import json
import os
import sys

from paddle_resnet import checkpoint, exported
from paddle_resnet.errors import UserError
from paddle_resnet.sparsity.pattern import compliance_table, sparse_parameters


def load_for_check(path):
    """(params, names marked sparse) of a checkpoint, a .pdparams file or an exported model."""
    if exported.is_exported_model(path):
        return exported.read_params(path), set(exported.read_info(path).get("sparse_2to4", []))
    if os.path.isdir(path):
        directory, meta = checkpoint.verify_checkpoint(path)
        path = os.path.join(directory, meta.get("prefix", checkpoint.PREFIX))
    # The weights and their ASP masks; not the optimizer state of the .pdopt file.
    params = checkpoint.read_state(path, optimizer=False)
    return params, set(sparse_parameters(params))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m paddle_resnet.sparsity", allow_abbrev=False,
        description="Report the 2:4 compliance and density of every weight of a checkpoint "
                    "folder, a .pdparams file or an exported inference model. Exit code 1 when "
                    "a weight marked sparse (saved with an ASP mask, or listed by the export) "
                    "is not 2:4.")
    parser.add_argument("path")
    parser.add_argument("--json", help="also write the table to this JSON file")
    args = parser.parse_args(argv)
    try:
        params, marked = load_for_check(args.path)
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
