"""Per-class cost of a model against a reference: each validation of REPORT (e.g. a pruned
model's run: right after pruning, then after each retraining epoch) against the last
validation of REFERENCE (the dense model's), from their reports' per-class records.

    .venv/bin/python scripts/compare_classes.py output/demo/report.json \
        output/demo_asp/report.json --output benchmarks/asp_classes_resnet18_demo.json

Prints, per validation, top-1, balanced top-1 and the classes that lost most (points and
images); --output writes the same as JSON.
"""

import argparse
import json
import sys

from paddle_resnet.core.errors import exit_status
from paddle_resnet.core.metrics import class_changes, describe_class_changes
from paddle_resnet.core.report import validations


def compare(reference_path, report_path, shown):
    """The rows: the reference's last validation, then each of the report's against it."""
    epoch, val, reference = validations(reference_path)[-1]
    rows = [
        {
            "report": reference_path,
            "epoch": epoch,
            "top1": val["val.top1"],
            "balanced_top1": reference["balanced_top1"],
        }
    ]
    for epoch, val, result in validations(report_path):
        rows.append(
            {
                "report": report_path,
                "epoch": epoch,
                "top1": val["val.top1"],
                "balanced_top1": result["balanced_top1"],
                "lost_most": class_changes(reference, result, shown),
            }
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", help="the reference model's report.json (its last validation)")
    parser.add_argument("report", help="the compared run's report.json (each validation)")
    parser.add_argument("--classes", type=int, default=5, help="classes shown per row")
    parser.add_argument("--output", help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = compare(args.reference, args.report, args.classes)
    for row in rows:
        changes = describe_class_changes(row["lost_most"]) if "lost_most" in row else "reference"
        print(
            f"{row['report']} epoch {row['epoch']}: top-1 {100 * row['top1']:.2f} %, balanced "
            f"{100 * row['balanced_top1']:.2f} %; {changes}"
        )
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"rows": rows}, handle, indent=1)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
