"""The int8 model.onnx made for CPU int8 kernels: activations that cannot be negative
quantized unsigned.

Paddle's PTQ and QAT quantize every activation as signed int8 with zero point 0 (range
[-128, 127] steps of its scale). After a ReLU half of that range is never used, and the
CPU's int8 dot products take unsigned activations (VNNI: u8 x s8), so a signed tensor
is shifted and compensated. Requantized as u8 with zero point 0 over the same range
[0, 127 x scale], the steps halve and the shift goes: measured on ResNet-50 through
OpenVINO, batch 1 went from 0.87x to 0.96x of OpenVINO's own NNCF int8 in one trial
(docs/measurements.md, "CPU inference", has the benchmark). The Paddle model itself is
left as quantized (Paddle Inference's oneDNN int8 reads it).
"""

import collections

import numpy as np

from paddle_resnet.core.optional import require

# ops whose output is non-negative when their input is
SIGN_PRESERVING = {"MaxPool", "AveragePool", "GlobalAveragePool", "DequantizeLinear"}


def _constant(graph, producers, name):
    """The value of ``name``: an initializer or the output of a Constant node."""
    numpy_helper = require("onnx.numpy_helper", "int8 ONNX export")
    for initializer in graph.initializer:
        if initializer.name == name:
            return numpy_helper.to_array(initializer)
    node = producers.get(name)
    if node is None or node.op_type != "Constant":
        return None
    return numpy_helper.to_array(node.attribute[0].t)


def _non_negative(name, producers):
    """Whether tensor ``name`` is a ReLU's output, or one passed on by ops that keep signs
    (pooling; a dequantize whose quantize reads such a tensor)."""
    node = producers.get(name)
    while node is not None and node.op_type in SIGN_PRESERVING:
        if node.op_type == "DequantizeLinear":
            quantize = producers.get(node.input[0])
            if quantize is None or quantize.op_type != "QuantizeLinear":
                return False
            node = quantize
        node = producers.get(node.input[0])
    return node is not None and node.op_type == "Relu"


def unsigned_after_relu(path):
    """Rewrite model.onnx at ``path``: each signed, zero-point-0 quantize/dequantize pair
    of a non-negative activation becomes unsigned over the same range. Returns how many."""
    onnx = require("onnx", "int8 ONNX export")
    numpy_helper = require("onnx.numpy_helper", "int8 ONNX export")
    model = onnx.load(path)
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    changed = 0
    for quantize in [n for n in graph.node if n.op_type == "QuantizeLinear"]:
        if len(quantize.input) < 3 or not _non_negative(quantize.input[0], producers):
            continue
        zero_point = _constant(graph, producers, quantize.input[2])
        dequantizes = consumers[quantize.output[0]]
        if (
            zero_point is None
            or zero_point.dtype != np.int8
            or zero_point.any()
            or any(n.op_type != "DequantizeLinear" for n in dequantizes)
        ):
            continue
        scale = _constant(graph, producers, quantize.input[1]).astype(np.float32)
        names = (quantize.output[0] + ".u8_scale", quantize.output[0] + ".u8_zero_point")
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.asarray(scale * 127 / 255, np.float32), names[0]),
                numpy_helper.from_array(np.zeros(zero_point.shape, np.uint8), names[1]),
            ]
        )
        for node in [quantize, *dequantizes]:
            node.input[1], node.input[2] = names
        changed += 1
    onnx.save(model, path)
    return changed
