"""The int8 model.onnx made for CPU int8 kernels: activations that cannot be negative
quantized unsigned, and no requantization in front of a ReLU.

Paddle's PTQ and QAT quantize every activation as signed int8 with zero point 0 (range
[-128, 127] steps of its scale). After a ReLU half of that range is never used, and the
CPU's int8 dot products take unsigned activations (VNNI: u8 x s8), so a signed tensor
is shifted and compensated. Requantized as u8 with zero point 0 over the same range
[0, 127 x scale], the steps halve and the shift goes: measured on ResNet-50 through
OpenVINO, batch 1 went from 0.87x to 0.96x of OpenVINO's own NNCF int8 in one trial
(docs/measurements.md, "CPU inference", has the benchmark). The Paddle model itself is
left as quantized (Paddle Inference's oneDNN int8 reads it).

Paddle also quantizes the output of every convolution and residual add, also where a
ReLU follows and its own output is quantized again: such a pair in front of a ReLU only
rounds twice, and costs OpenVINO time (NNCF quantizes after the ReLU only). Those pairs
are removed.
"""

import collections

import numpy as np

from paddle_resnet.core.optional import require

# ops whose output is non-negative when their input is
SIGN_PRESERVING = {"MaxPool", "AveragePool", "GlobalAveragePool", "DequantizeLinear"}


class _Graph:
    """An ONNX graph with its producer, consumer and initializer index."""

    def __init__(self, graph):
        self.graph = graph
        self.producers = {output: node for node in graph.node for output in node.output}
        self.consumers = collections.defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.initializers = {i.name: i for i in graph.initializer}

    def constant(self, name):
        """The value of ``name``: an initializer or a Constant node's output; else None."""
        numpy_helper = require("onnx.numpy_helper", "int8 ONNX export")
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producers.get(name)
        if node is None or node.op_type != "Constant":
            return None
        return numpy_helper.to_array(node.attribute[0].t)

    def non_negative(self, name):
        """Whether tensor ``name`` is a ReLU's output, or one passed on by ops that keep
        signs (pooling; a dequantize whose quantize reads such a tensor)."""
        node = self.producers.get(name)
        while node is not None and node.op_type in SIGN_PRESERVING:
            if node.op_type == "DequantizeLinear":
                quantize = self.producers.get(node.input[0])
                if quantize is None or quantize.op_type != "QuantizeLinear":
                    return False
                node = quantize
            node = self.producers.get(node.input[0])
        return node is not None and node.op_type == "Relu"

    def quantize_pairs(self):
        """(quantize, its dequantizes) for each quantize read by dequantizes only."""
        for quantize in [n for n in self.graph.node if n.op_type == "QuantizeLinear"]:
            dequantizes = self.consumers[quantize.output[0]]
            if dequantizes and all(n.op_type == "DequantizeLinear" for n in dequantizes):
                yield quantize, dequantizes


def _drop_requantize_before_relu(graph):
    """Remove each quantize/dequantize pair between a convolution or add and ReLUs that
    alone read it; returns how many."""
    dropped = []
    for quantize, dequantizes in graph.quantize_pairs():
        source = graph.producers.get(quantize.input[0])
        readers = [n for dq in dequantizes for n in graph.consumers[dq.output[0]]]
        if source is None or source.op_type not in ("Conv", "Add") or not readers:
            continue
        if any(n.op_type != "Relu" for n in readers):
            continue
        for dequantize in dequantizes:
            for relu in graph.consumers[dequantize.output[0]]:
                relu.input[list(relu.input).index(dequantize.output[0])] = quantize.input[0]
        dropped += [quantize, *dequantizes]
    for node in dropped:
        graph.graph.node.remove(node)
    return sum(n.op_type == "QuantizeLinear" for n in dropped)


def _unsigned_after_relu(graph):
    """Each signed, zero-point-0 pair of a non-negative activation made unsigned over the
    same range; returns how many."""
    numpy_helper = require("onnx.numpy_helper", "int8 ONNX export")
    changed = 0
    for quantize, dequantizes in graph.quantize_pairs():
        if len(quantize.input) < 3 or not graph.non_negative(quantize.input[0]):
            continue
        zero_point = graph.constant(quantize.input[2])
        if zero_point is None or zero_point.dtype != np.int8 or zero_point.any():
            continue
        scale = graph.constant(quantize.input[1]).astype(np.float32)
        names = (quantize.output[0] + ".u8_scale", quantize.output[0] + ".u8_zero_point")
        graph.graph.initializer.extend(
            [
                numpy_helper.from_array(np.asarray(scale * 127 / 255, np.float32), names[0]),
                numpy_helper.from_array(np.zeros(zero_point.shape, np.uint8), names[1]),
            ]
        )
        for node in [quantize, *dequantizes]:
            node.input[1], node.input[2] = names
        changed += 1
    return changed


def for_cpu_int8(path):
    """Rewrite the int8 model.onnx at ``path`` (module docstring); returns
    {rewrite: how many pairs}."""
    onnx = require("onnx", "int8 ONNX export")
    model = onnx.load(path)
    counts = {"dropped before a ReLU": _drop_requantize_before_relu(_Graph(model.graph))}
    counts["made unsigned"] = _unsigned_after_relu(_Graph(model.graph))
    onnx.save(model, path)
    return counts
