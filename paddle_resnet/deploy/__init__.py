"""Deployment: the exported-model folder (exported.py), the backends that run it
(backends.py names them; predictor.py, openvino_runtime.py, onnx_runtime.py serve them),
post-training quantization (ptq.py), export itself and the check of an exported model."""
