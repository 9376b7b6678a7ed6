"""OpenVINO's own int8: an export's fp32 ``model.onnx`` quantized by NNCF, the yardstick
the toolkit's int8 is measured against (speed: scripts/benchmark_inference.py; accuracy:
scripts/compare_quantization.py --nncf). It is not a PTQ engine of export_model.py: on
the demo and on ResNet-50 it was neither faster nor more accurate than the toolkit's own
scales (docs/measurements.md, "CPU inference"), which serve Paddle Inference, ONNX Runtime
and OpenVINO alike.

NNCF lives outside the venv (scripts/setup_nncf.sh: its numpy 2 would replace the numpy
1.26 Paddle 2.6 needs), in a folder found by ``site``.
"""

import os
import sys

from paddle_resnet.core.optional import require

# where scripts/setup_nncf.sh installs NNCF, beside the repository's venv
DEFAULT_SITE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".nncf-site"
)
# NNCF's presets: "performance" (symmetric int8 throughout, its choice for CNNs on the
# CPU) and "mixed" (asymmetric activations, for accuracy)
PRESETS = ("performance", "mixed")


def import_nncf(site, purpose):
    """nncf, from ``site`` when it is there. Appended to the path, so that the venv's own
    packages (numpy 1.26 for Paddle) win over the copies nncf brought."""
    if os.path.isdir(site) and site not in sys.path:
        sys.path.append(site)
    return require("nncf", purpose)


def quantize(nncf, core, onnx_path, batches, preset):
    """The fp32 ``onnx_path`` as OpenVINO reads it, quantized by NNCF (its OpenVINO
    backend, the path OpenVINO documents) with ``preset`` on the images of ``batches``,
    one per item so that subset_size counts images."""
    images = [image[None] for batch in batches for image in batch]
    return nncf.quantize(
        core.read_model(onnx_path),
        nncf.Dataset(images),
        preset=nncf.QuantizationPreset(preset),
        subset_size=len(images),
    )
