"""Export a trained ResNet to a Paddle Inference model (and ONNX / OpenVINO / INT8).

    python export_model.py --config resnet18_demo --from-checkpoint output/demo/resnet18 \\
        --inference-dir inference/resnet18_demo

An entry point only: what it does is paddle_resnet/commands/export_model.py.
"""

import sys

from paddle_resnet.commands import export_model

if __name__ == "__main__":
    sys.exit(export_model.main())
