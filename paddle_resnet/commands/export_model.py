"""Export a trained ResNet to a Paddle Inference model (probabilities out).

    python export_model.py --config resnet18_demo --from-checkpoint output/demo/resnet18 \\
        --inference-dir inference/resnet18_demo

Writes the exported-model folder (``paddle_resnet/deploy/exported.py``: inference.pdmodel /
inference.pdiparams, loadable by paddle.inference on Paddle 2.6 and 3.x, classes.json,
model.json) and the JSON export report.
"""

import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import main_with


def run(config):
    """Export as ``config`` says; the console says where, on which IR and what was written."""
    from paddle_resnet.core import devices
    from paddle_resnet.deploy import export
    from paddle_resnet.training import ir

    for note in (devices.cpu_fallback_note(), ir.legacy_note(config)):
        if note:
            print(note)
    report = export.export(config)
    sizes = ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in report["files"].items())
    print(
        f"exported {report['arch']} ({report['layout']} {report['input_shape']}) "
        f"to {report['directory']}: {sizes}"
    )


def main(argv=None):
    bootstrap.prepare_process(argv)
    return main_with("export_model", __doc__.splitlines()[0], run, argv, REGISTRY_CHOICES)


if __name__ == "__main__":
    sys.exit(main())
