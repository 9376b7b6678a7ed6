"""A preflight before a long job: what this machine and its Paddle can run, and what
each finding means for the toolkit's options.

    python -m paddle_resnet.commands.doctor                    # the findings, one table
    python -m paddle_resnet.commands.doctor --require gpu,trt  # exit 1 unless both are here
    python -m paddle_resnet.commands.doctor --json             # the same findings as JSON

Requirements (``--require``): gpu, trt, nccl, dali-gpu, bf16, int8, onnx, legacy, pir
(the IRs whose programs build on this Paddle). Exit status 0
when every one is met, 1 when one is not (a line each names it and why), 2 for a
requirement name it does not know.
"""

import argparse
import json
import sys
from dataclasses import asdict

from paddle_resnet.core import bootstrap
from paddle_resnet.core.errors import exit_status


def check(args):
    """Print the findings (a table, or JSON); exit status 1 when a required one is unmet."""
    from paddle_resnet.core import preflight
    from paddle_resnet.training.graph_apis import graph_findings

    required = preflight.parse_requirements(args.require)
    found = preflight.findings(graph_findings())
    missing = preflight.unmet(found, required)
    if args.json:
        document = {"findings": [asdict(f) for f in found], "required": required, "unmet": missing}
        print(json.dumps(document, indent=1))
    else:
        print(preflight.table(found))
    for line in missing:
        print(f"error: required {line}", file=sys.stderr)
    return 1 if missing else 0


def main(argv=None):
    bootstrap.prepare_process(argv)
    from paddle_resnet.core import preflight

    parser = argparse.ArgumentParser(
        prog="python -m paddle_resnet.commands.doctor",
        description=__doc__.splitlines()[0],
        allow_abbrev=False,
    )
    parser.add_argument(
        "--require",
        default="",
        metavar="NAMES",
        help=f"comma-separated, of: {', '.join(preflight.REQUIREMENTS)}; exit 1 unless all are met",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    return exit_status(lambda: check(args))


if __name__ == "__main__":
    sys.exit(main())
