"""The int8 model.onnx made for CPU int8 kernels: activations that cannot be negative
quantized unsigned, and no requantization in front of a ReLU.

Paddle's PTQ and QAT quantize every activation as signed int8 with zero point 0. After a
ReLU half of that range is never used, and the CPU's int8 dot products take unsigned
activations (VNNI: u8 x s8), so a signed tensor is shifted and compensated. Requantized
as u8 over the same range, the steps halve and the shift goes: on ResNet-50 through
OpenVINO, batch 1 went from 0.87x to 0.96x of OpenVINO's own NNCF int8 in one trial
(docs/measurements.md). The Paddle model itself is left as quantized.

Paddle also quantizes the output of every convolution and residual add where a ReLU
follows and its own output is quantized again: such a pair only rounds twice, and costs
OpenVINO time (NNCF quantizes after the ReLU only). Those pairs are removed.

paddle2onnx 1.2.11 writes a quantized matmul (the classifier) in fp32, dropping the
quantization of its input and folding that of its weight: both are put back from the
Paddle model's ranges (at batch 1 the fp32 classifier's 8 MB are read for every image).
"""

import collections

import numpy as np

from paddle_resnet.core.errors import UserError
from paddle_resnet.core.optional import require

# ops whose output is non-negative when their input is
SIGN_PRESERVING = {
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "DequantizeLinear",
    "Reshape",
    "Flatten",
}


class _Graph:
    """An ONNX graph with its producer, consumer and initializer index."""

    def __init__(self, graph):
        self.numpy_helper = require("onnx.numpy_helper", "int8 ONNX export")
        self.graph = graph
        self.producers = {output: node for node in graph.node for output in node.output}
        self.consumers = collections.defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.initializers = {i.name: i for i in graph.initializer}

    def constant(self, name):
        """The value of ``name``: an initializer or a Constant node's output; else None."""
        if name in self.initializers:
            return self.numpy_helper.to_array(self.initializers[name])
        node = self.producers.get(name)
        if node is None or node.op_type != "Constant":
            return None
        return self.numpy_helper.to_array(node.attribute[0].t)

    def add_constant(self, name, value):
        self.graph.initializer.append(self.numpy_helper.from_array(value, name))
        return name

    def remove_constant(self, name):
        if name in self.initializers:
            self.graph.initializer.remove(self.initializers.pop(name))
        else:
            self.graph.node.remove(self.producers.pop(name))

    def non_negative(self, name):
        """Whether tensor ``name`` is a ReLU's output, or one passed on by ops that keep signs."""
        node = self.producers.get(name)
        while node is not None and node.op_type in SIGN_PRESERVING:
            if node.op_type == "DequantizeLinear":
                quantize = self.producers.get(node.input[0])
                if quantize is None or quantize.op_type != "QuantizeLinear":
                    return False
                node = quantize
            node = self.producers.get(node.input[0])
        return node is not None and node.op_type == "Relu"

    def redirect(self, old, new):
        for reader in self.consumers[old]:
            reader.input[list(reader.input).index(old)] = new

    def quantize_pairs(self):
        """(quantize, its dequantizes) for each quantize read by dequantizes only."""
        for quantize in [n for n in self.graph.node if n.op_type == "QuantizeLinear"]:
            dequantizes = self.consumers[quantize.output[0]]
            if dequantizes and all(n.op_type == "DequantizeLinear" for n in dequantizes):
                yield quantize, dequantizes


def _drop_requantize_before_relu(graph):
    """Remove each quantize/dequantize pair between a convolution or add and ReLUs."""
    dropped = []
    for quantize, dequantizes in graph.quantize_pairs():
        source = graph.producers.get(quantize.input[0])
        readers = [n for dq in dequantizes for n in graph.consumers[dq.output[0]]]
        relus_only = readers and all(n.op_type == "Relu" for n in readers)
        if source is None or source.op_type not in ("Conv", "Add") or not relus_only:
            continue
        for dequantize in dequantizes:
            graph.redirect(dequantize.output[0], quantize.input[0])
        dropped += [quantize, *dequantizes]
    for node in dropped:
        graph.graph.node.remove(node)
    return sum(n.op_type == "QuantizeLinear" for n in dropped)


# The name of a weight stored in int8 (``from_fp32``): the fp32 weight's, with this suffix.
INT8_WEIGHT_SUFFIX = ".int8"
# The ops quantized from an fp32 graph, by the axis of their weight's output channels.
WEIGHT_CHANNEL_AXIS = {"Conv": 0, "MatMul": 1}


def _input_pair(graph, data, abs_range, name, shared_inputs):
    """(new nodes, the dequantized name) of a signed pair of ``data`` over ``abs_range``;
    one already made for the same tensor and range is reused (``shared_inputs``)."""
    helper = require("onnx.helper", "int8 ONNX export")
    dequantized = shared_inputs.get((data, abs_range))
    if dequantized is not None:
        return [], dequantized
    dequantized = shared_inputs[data, abs_range] = f"{name}.int8.dequantized"
    data_range = [
        graph.add_constant(f"{name}.int8_scale", np.asarray(abs_range / 127, np.float32)),
        graph.add_constant(f"{name}.int8_zero_point", np.asarray(0, np.int8)),
    ]
    quantized = f"{name}.quantized"
    nodes = [
        helper.make_node("QuantizeLinear", [data, *data_range], [quantized]),
        helper.make_node("DequantizeLinear", [quantized, *data_range], [dequantized]),
    ]
    return nodes, dequantized


def _insert_before(graph, node, nodes):
    """Insert ``nodes``, in order, in front of ``node``."""
    position = list(graph.graph.node).index(node)
    for offset, new_node in enumerate(nodes):
        graph.graph.node.insert(position + offset, new_node)


def _quantize_weighted(graph, input_ranges, op_types, shared_inputs):
    """Quantize each fp32 op of ``op_types`` whose constant weight is named in
    ``input_ranges`` ({weight name: its input's absolute maximum}): the input by a signed
    pair over that range, the weight per output channel by its absolute maximum (a legacy
    export's matmul weights lie on Paddle's int8 grid already: they come back exactly)."""
    helper = require("onnx.helper", "int8 ONNX export")
    quantized = 0
    for node in [n for n in graph.graph.node if n.op_type in op_types]:
        data, weight_name = node.input[:2]
        weight = graph.constant(weight_name)
        if weight_name not in input_ranges or weight is None:
            continue
        axis = WEIGHT_CHANNEL_AXIS[node.op_type]
        others = tuple(i for i in range(weight.ndim) if i != axis)
        scale = np.abs(weight).max(axis=others, keepdims=True) / 127
        scale[scale == 0] = 1
        int8_weight = [
            graph.add_constant(
                weight_name + INT8_WEIGHT_SUFFIX, np.round(weight / scale).astype(np.int8)
            ),
            graph.add_constant(f"{weight_name}.int8_scale", scale.ravel().astype(np.float32)),
            graph.add_constant(f"{weight_name}.int8_zero_point", np.zeros(scale.size, np.int8)),
        ]
        dequantized_weight = f"{weight_name}.int8.dequantized"
        nodes = [helper.make_node("DequantizeLinear", int8_weight, [dequantized_weight], axis=axis)]
        pair, dequantized_data = _input_pair(
            graph, data, input_ranges[weight_name], f"{weight_name}.input", shared_inputs
        )
        _insert_before(graph, node, nodes + pair)
        node.input[:2] = [dequantized_data, dequantized_weight]
        if graph.consumers[weight_name] == [node]:  # the fp32 copy, read by no one now
            graph.remove_constant(weight_name)
        quantized += 1
    return quantized


def residual_adds(graph):
    """The Add nodes of two activations (a bias add has a constant), in graph order."""
    return [
        node
        for node in graph.graph.node
        if node.op_type == "Add" and all(graph.constant(name) is None for name in node.input)
    ]


def _quantize_residual_adds(graph, add_ranges, shared_inputs):
    """Both inputs of each residual add quantized over its ``add_ranges`` (per add, in the
    order of ``residual_adds``); a shortcut quantized for a convolution keeps that pair."""
    adds = residual_adds(graph)
    if len(adds) != len(add_ranges):
        raise UserError(
            f"model.onnx has {len(adds)} residual adds, the calibration {len(add_ranges)}: "
            "paddle2onnx changed the program's adds; export again without --onnx, or with "
            "another paddle2onnx"
        )
    for k, (node, ranges) in enumerate(zip(adds, add_ranges)):
        for i, abs_range in enumerate(ranges):
            if abs_range <= 0:
                continue
            nodes, dequantized = _input_pair(
                graph, node.input[i], abs_range, f"residual_add_{k}.input_{i}", shared_inputs
            )
            _insert_before(graph, node, nodes)
            node.input[i] = dequantized
    return len(adds)


def _sort_topologically(graph):
    """Each node after the producers of its inputs (a shared pair may come first)."""
    nodes = list(graph.graph.node)
    made = {i.name for i in graph.graph.input} | set(graph.initializers)
    ordered = []
    while nodes:
        ready = next(n for n in nodes if all(name in made or not name for name in n.input))
        nodes.remove(ready)
        ordered.append(ready)
        made.update(ready.output)
    del graph.graph.node[:]
    graph.graph.node.extend(ordered)


def _quantize_before_max_pool(graph):
    """Each pair quantizing a max pool's output (read by it alone) moved in front of the
    pool, which then runs on int8 (``max`` and a quantization commute), as NNCF does:
    OpenVINO ran the stem's pool in fp32 otherwise (0.17 ms of ResNet-50's 8 ms at batch 1)."""
    moved = 0
    for quantize, dequantizes in list(graph.quantize_pairs()):
        pool = graph.producers.get(quantize.input[0])
        if pool is None or pool.op_type != "MaxPool" or len(dequantizes) != 1:
            continue
        if len(graph.consumers[pool.output[0]]) != 1:
            continue
        (dequantize,) = dequantizes
        graph.redirect(dequantize.output[0], pool.output[0])
        quantize.input[0] = pool.input[0]
        pool.input[0] = dequantize.output[0]
        moved += 1
    return moved


def _unsigned_after_relu(graph):
    """Each signed pair of a non-negative activation made unsigned over the same range."""
    changed = 0
    for quantize, dequantizes in graph.quantize_pairs():
        if len(quantize.input) < 3 or not graph.non_negative(quantize.input[0]):
            continue
        zero_point = graph.constant(quantize.input[2])
        if zero_point is None or zero_point.dtype != np.int8 or zero_point.any():
            continue
        scale = graph.constant(quantize.input[1]).astype(np.float32)
        output = quantize.output[0]
        names = (
            graph.add_constant(output + ".u8_scale", np.asarray(scale * 127 / 255, np.float32)),
            graph.add_constant(output + ".u8_zero_point", np.zeros(zero_point.shape, np.uint8)),
        )
        replaced = quantize.input[1:3]
        pair = [quantize, *dequantizes]
        for node in pair:
            node.input[1], node.input[2] = names
        for name in replaced:  # the signed scale and zero point, if no one else reads them
            if all(any(node is n for n in pair) for node in graph.consumers[name]):
                graph.remove_constant(name)
        changed += 1
    return changed


def for_cpu_int8(path, matmul_input_ranges):
    """Rewrite the int8 model.onnx at ``path`` (module docstring); {rewrite: how many}."""
    onnx = require("onnx", "int8 ONNX export")
    model = onnx.load(path)
    counts = {"dropped before a ReLU": _drop_requantize_before_relu(_Graph(model.graph))}
    counts["matmuls quantized"] = _quantize_weighted(
        _Graph(model.graph), matmul_input_ranges, ("MatMul",), {}
    )
    counts["made unsigned"] = _unsigned_after_relu(_Graph(model.graph))
    onnx.save(model, path)
    return counts


def from_fp32(path, input_ranges, add_ranges=()):
    """Rewrite the fp32 model.onnx at ``path`` (of a PIR export) into int8: the inputs and
    weights of the ops ``input_ranges`` names, both inputs of each residual add over
    ``add_ranges`` (PTQ's; a QAT model has none), max pools on int8, after-ReLU inputs
    unsigned. Only inputs are quantized, never outputs, so there is no requantization in
    front of a ReLU to remove (NNCF quantizes the same places); returns {rewrite: how many}."""
    onnx = require("onnx", "int8 ONNX export")
    model = onnx.load(path)
    graph, shared = _Graph(model.graph), {}
    counts = {"quantized": _quantize_weighted(graph, input_ranges, WEIGHT_CHANNEL_AXIS, shared)}
    if add_ranges:
        counts["residual adds quantized"] = _quantize_residual_adds(
            _Graph(model.graph), add_ranges, shared
        )
    counts["max pools on int8"] = _quantize_before_max_pool(_Graph(model.graph))
    _sort_topologically(_Graph(model.graph))
    if counts["quantized"] < len(input_ranges):
        raise UserError(
            f"{path}: {len(input_ranges) - counts['quantized']} of the {len(input_ranges)} "
            "quantized weights are not convolution or matmul weights of model.onnx"
        )
    counts["made unsigned"] = _unsigned_after_relu(_Graph(model.graph))
    onnx.save(model, path)
    return counts
