"""Export a trained ResNet to a Paddle Inference model (probabilities out).

    python export_model.py --config resnet18_demo --from-checkpoint output/demo/resnet18 \\
        --inference-dir inference/resnet18_demo

Writes the exported-model folder (``paddle_resnet/deploy/exported.py``: inference.pdmodel /
inference.pdiparams, loadable by paddle.inference on Paddle 2.6 and 3.x, classes.json,
model.json) and the JSON export report.
"""

import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core.cli import main_with
from paddle_resnet.deploy import export


def main(argv=None):
    return main_with(
        "export_model", __doc__.splitlines()[0], export.export_and_describe, argv, REGISTRY_CHOICES
    )


if __name__ == "__main__":
    sys.exit(main())
