"""NNCF's side of ``nncf_int8.py``, run by it as a process of its own with NNCF's folder
on its PYTHONPATH; it imports neither Paddle nor the toolkit, which would load Paddle.

    python -P nncf_quantize.py version
    python -P nncf_quantize.py quantize <fp32 model.onnx> <images.npy> <preset> <out.xml>
"""

import sys

import nncf
import numpy as np
import openvino as ov


def quantize(onnx_path, images_path, preset, out_path):
    """The fp32 ``onnx_path`` quantized by NNCF's OpenVINO backend with ``preset`` on the
    images of ``images_path`` (one per item: subset_size counts images), written as an
    OpenVINO IR with its weights as they are (the IR's default compresses them to fp16)."""
    images = [image[None] for image in np.load(images_path)]
    model = nncf.quantize(
        ov.Core().read_model(onnx_path),
        nncf.Dataset(images),
        preset=nncf.QuantizationPreset(preset),
        subset_size=len(images),
    )
    ov.save_model(model, out_path, compress_to_fp16=False)


def version():
    print(nncf.__version__)


COMMANDS = {"version": version, "quantize": quantize}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
