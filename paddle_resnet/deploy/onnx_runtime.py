"""ONNX Runtime as a CPU backend of the exported model's ``model.onnx``
(``export_model.py --onnx``; ``inference.py --backend onnxruntime``). It runs the model as
written: fp32, or int8 where the export carries quantize/dequantize pairs."""

import os

import numpy as np

from paddle_resnet.core import bootstrap
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.optional import require
from paddle_resnet.deploy import exported


def session(path, threads=0):
    """An ONNX Runtime CPU session of the model at ``path`` (``threads`` 0: its choice)."""
    onnxruntime = require("onnxruntime", "--backend onnxruntime")
    options = onnxruntime.SessionOptions()
    # its warnings (initializers paddle2onnx left unused) are chatter: errors only
    options.log_severity_level = 0 if bootstrap.verbose() else 3
    if threads:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


class OnnxClassifier:
    """An ONNX Runtime session: float images in, class probabilities out."""

    def __init__(self, model_dir, inference_config):
        path = os.path.join(model_dir, exported.ONNX_FILE)
        if not os.path.exists(path):
            raise UserError(f"{path} does not exist: export with --onnx first")
        self.session = session(path, inference_config.cpu_threads)
        self.input = self.session.get_inputs()[0].name

    def __call__(self, images):
        return self.session.run(None, {self.input: np.ascontiguousarray(images, np.float32)})[0]
