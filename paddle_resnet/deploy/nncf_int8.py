"""OpenVINO's own int8: an export's fp32 ``model.onnx`` quantized by NNCF, the yardstick
the toolkit's int8 is measured against (scripts/benchmark_inference.py,
scripts/compare_quantization.py --nncf). Not a PTQ engine of export_model.py: it was
neither faster nor more accurate than the toolkit's own scales (docs/measurements.md).

NNCF lives outside the venv (scripts/setup_nncf.sh: its numpy 2 would replace the numpy
1.26 Paddle 2.6 needs), in a folder that only a child process sees (``nncf_quantize.py``).
"""

import os
import tempfile

import numpy as np

from paddle_resnet.core import bootstrap, child_process
from paddle_resnet.core.optional import not_installed

# where scripts/setup_nncf.sh installs NNCF, beside the repository's venv
DEFAULT_SITE = os.path.join(bootstrap.REPOSITORY, ".nncf-site")
# NNCF's presets: "performance" (symmetric int8 throughout, its choice for CNNs on the
# CPU) and "mixed" (asymmetric activations, for accuracy)
PRESETS = ("performance", "mixed")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nncf_quantize.py")


def _run_child(site, purpose, *args):
    """``nncf_quantize.py args`` in NNCF's environment; its output, or a UserError in one
    line (NNCF not in ``site``, or its last line when it failed)."""
    if not os.path.isdir(os.path.join(site, "nncf")):
        raise not_installed("nncf", purpose)
    paths = [site] + [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    # -P: the child's own folder (the toolkit's deploy/) stays off its path
    return child_process.run(
        ["-P", CHILD, *args],
        f"NNCF ({site}) failed for {purpose}",
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)),
    ).strip()


def version(site, purpose):
    """The version of the NNCF in ``site``; a UserError saying ``purpose`` needs it."""
    return _run_child(site, purpose, "version")


def quantize(site, onnx_path, batches, preset, out_path):
    """``out_path``: an OpenVINO IR of ``onnx_path`` quantized by NNCF on ``batches``."""
    with tempfile.TemporaryDirectory(prefix="nncf_images_") as scratch:
        images = os.path.join(scratch, "images.npy")
        np.save(images, np.concatenate(list(batches)))
        purpose = f"the {preset} int8 of {onnx_path}"
        _run_child(site, purpose, "quantize", onnx_path, images, preset, out_path)
    return out_path
