"""``python -m paddle_resnet.commands.check_sparsity PATH``: what will ship, weight by
weight (shape, density, 2:4 or not, precision), for a checkpoint folder, a .pdparams
file or an exported model and its model.onnx. Exit code 1 when a weight marked sparse
is not 2:4."""

import argparse
import sys

from paddle_resnet.core import bootstrap
from paddle_resnet.core.errors import exit_status


def main(argv=None):
    bootstrap.prepare_process(argv)
    from paddle_resnet.deploy import sparsity_report

    parser = argparse.ArgumentParser(
        prog="python -m paddle_resnet.commands.check_sparsity",
        allow_abbrev=False,
        description="Report every weight of a checkpoint folder, a .pdparams file or an exported "
        "inference model (and its model.onnx): shape, density, 2:4 or not, precision (fp32, or "
        "int8 and the source of its scale). Exit code 1 when a weight marked sparse (saved with an "
        "ASP mask, or listed by the export) is not 2:4, in any of them.",
    )
    parser.add_argument("path")
    parser.add_argument("--json", help="also write the tables to this JSON file")
    args = parser.parse_args(argv)
    return exit_status(lambda: 1 if sparsity_report.report(args.path, args.json) else 0)


if __name__ == "__main__":
    sys.exit(main())
