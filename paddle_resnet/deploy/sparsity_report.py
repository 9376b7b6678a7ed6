"""What will ship, weight by weight: shape, density, whether it holds the sparsity
pattern its file records (2:4 for files without the record), and its precision, for a
checkpoint, a .pdparams file or an exported model (and its model.onnx): the library of
``paddle-resnet-check-sparsity``, and export's last check of what it wrote (``check``)."""

import json
import os

import numpy as np

from paddle_resnet.core import paddle_internals
from paddle_resnet.core.optional import require
from paddle_resnet.deploy import exported, onnx_int8
from paddle_resnet.training import checkpoint
from paddle_resnet.training.qat import QAT_SUFFIXES
from paddle_resnet.training.sparsity.pattern import (
    NVIDIA_2_4,
    Pattern,
    SparsityViolation,
    compliance_table,
    recorded,
)

WEIGHT_SCALE = "@scale"


def scale_source(quantization):
    """Where an exported model's int8 scales came from, as model.json records it."""
    if not quantization:
        return None
    if quantization["method"] == "qat":
        return "QAT-trained scale"
    return f"PTQ {quantization['algo']}, {quantization['calibration_images']} calibration images"


def marked_weights(record):
    """(pattern, names) of a sparsity record (None: no sparse weights, checked as 2:4)."""
    if not record:
        return NVIDIA_2_4, set()
    return Pattern.parse(record["pattern"]), set(record["weights"])


def load_for_check(path):
    """(params, sparsity record, source of the int8 scales) of a checkpoint or .pdparams."""
    meta = None
    if os.path.isdir(path):
        directory, meta = checkpoint.verify_checkpoint(path)
        path = os.path.join(directory, meta.get("prefix", checkpoint.PREFIX))
    prefix = path[: -len(".pdparams")] if path.endswith(".pdparams") else path
    # The weights and their ASP masks, and a QAT run's scales (kept in the .pdopt file);
    # not the optimizer state.
    params = checkpoint.read_state(path, optimizer=False)
    source = None
    if os.path.exists(prefix + ".pdopt"):
        rest = checkpoint.read_state(prefix)
        scales = {name: value for name, value in rest.items() if name.endswith(QAT_SUFFIXES)}
        params.update(scales)
        source = "QAT-trained scale" if scales else None
    return params, recorded(meta, params), source


def onnx_weights(model_dir):
    """({weight name: array}, the weights a QuantizeLinear reads) of its model.onnx, or None."""
    path = os.path.join(model_dir, exported.ONNX_FILE)
    if not os.path.exists(path):
        return None
    onnx = require("onnx", "checking model.onnx")
    numpy_helper = require("onnx.numpy_helper", "checking model.onnx")
    graph = onnx.load(path).graph
    weights = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    # paddle2onnx writes the weights as Constant nodes, named by their output
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            weights[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    quantized = {node.input[0] for node in graph.node if node.op_type == "QuantizeLinear"}
    # weights stored in int8 (a PIR export's int8 model.onnx): checked as their int8
    # values, under the fp32 weight's name (zeros stay zeros)
    suffix = onnx_int8.INT8_WEIGHT_SUFFIX
    for node in graph.node:
        stored = node.input[0] if node.op_type == "DequantizeLinear" else None
        if stored and stored.endswith(suffix) and stored in weights:
            name = stored[: -len(suffix)]
            weights[name] = weights.pop(stored).astype(np.float32)
            quantized.add(name)
    return weights, quantized & set(weights)


def rows_with_precision(params, sparsity, quantized, source):
    """The compliance table against a sparsity record, each weight with its precision."""
    pattern, marked = marked_weights(sparsity)
    rows = compliance_table(
        {n: v for n, v in params.items() if not n.endswith(QAT_SUFFIXES)}, marked, pattern
    )
    for row in rows:
        row["precision"] = f"int8 ({source})" if row["param"] in quantized else "fp32"
    return rows


def scaled(params):
    """The weights a Paddle program quantizes: those with a scale (``<weight>@scale``)."""
    return {name[: -len(WEIGHT_SCALE)] for name in params if name.endswith(WEIGHT_SCALE)}


def print_rows(rows, title, pattern):
    print(title)
    print(f"  {'weight':32s} {'shape':20s} density pattern  precision")
    for row in rows:
        held = str(pattern) if row["holds_pattern"] else "dense"
        broken = row["marked_sparse"] and not row["holds_pattern"]
        flag = f"  <-- marked sparse but NOT {pattern}" if broken else ""
        print(
            f"  {row['param']:32s} {str(row['shape']):20s} {row['density']:.3f}   "
            f"{held:7s}  {row['precision']}{flag}"
        )


def tables(path):
    """({where: rows} for ``path`` and its model.onnx; the sparsity record). A PIR export
    on Paddle 2.6, which cannot read its program, is checked through its model.onnx alone."""
    if not exported.is_exported_model(path):
        params, sparsity, source = load_for_check(path)
        return {path: rows_with_precision(params, sparsity, scaled(params), source)}, sparsity
    onnx_model = onnx_weights(path)
    info = exported.read_info(path)
    sparsity, source = exported.sparsity(info), scale_source(info.get("quantization"))
    result = {}
    if not (onnx_model and exported.is_pir_export(path) and not paddle_internals.PADDLE3):
        params = exported.read_params(path)
        result[path] = rows_with_precision(params, sparsity, scaled(params), source)
    if onnx_model:
        weights, quantized = onnx_model
        result[os.path.join(path, exported.ONNX_FILE)] = rows_with_precision(
            {n: np.asarray(v) for n, v in weights.items()}, sparsity, quantized, source
        )
    return result, sparsity


def violations(found, sparsity):
    """``where: weight`` of each weight marked sparse that breaks its pattern or is missing."""
    _, marked = marked_weights(sparsity)
    failures = []
    for where, rows in found.items():
        bad = [r["param"] for r in rows if r["marked_sparse"] and not r["holds_pattern"]]
        missing = sorted(marked - {r["param"] for r in rows})
        failures += [f"{where}: {name}" for name in bad + missing]
    return failures


def check(path, where):
    """SparsityViolation, in one line, for a weight an export marks sparse that does not
    hold its pattern (or is missing) in ``path``."""
    sparsity = exported.sparsity(exported.read_info(path))
    if not sparsity:
        return
    broken = violations(tables(path)[0], sparsity)
    if broken:
        names = [failure.rsplit(": ", 1)[1] for failure in broken]
        raise SparsityViolation(f"{where}: weights not {sparsity['pattern']} sparse: {names[:3]}")


def report(path, json_path=None):
    """Print the tables of ``path``; returns the violations (``violations``)."""
    found, sparsity = tables(path)
    pattern, marked = marked_weights(sparsity)
    for where, rows in found.items():
        print_rows(rows, where, pattern)
        bad = sum(r["marked_sparse"] and not r["holds_pattern"] for r in rows)
        missing = len(marked - {r["param"] for r in rows})
        print(
            f"{sum(r['marked_sparse'] for r in rows)} weights marked sparse, {bad} "
            f"violate {pattern}, {missing} missing, {sum(r['holds_pattern'] for r in rows)} "
            f"of {len(rows)} are {pattern}, {sum(r['precision'] != 'fp32' for r in rows)} int8"
        )
    failures = violations(found, sparsity)
    if json_path:
        document = {"path": path, "pattern": str(pattern), "tables": found, "violations": failures}
        with open(json_path, "w") as handle:
            json.dump(document, handle, indent=1)
    return failures
