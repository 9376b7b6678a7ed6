"""int8 for PIR exports, without the legacy IR: the ranges of the convolution and matmul
inputs, from the toolkit's own calibration (PTQ) or from the trained quantizers (QAT),
and the fp32 program paddle2onnx converts before ``onnx_int8.from_fp32`` writes those
ranges into model.onnx as quantize/dequantize pairs.

Why not Paddle's own tools: ``PostTrainingQuantization`` builds on the legacy IR only,
Paddle 3 has no oneDNN int8 passes for PIR programs, and paddle2onnx 2.x converts
Paddle's quantize ops as float8 only (it aborts the process). So the Paddle program of a
PIR int8 export stays fp32 (PTQ) or keeps QAT's simulated quantization, and int8 runs
from model.onnx in OpenVINO and ONNX Runtime.

Ranges are keyed by the weight each input meets (``conv2d_3.w_0``): paddle2onnx keeps
parameter names. PTQ also calibrates both inputs of each residual add, as NNCF does:
OpenVINO then adds in int8 and writes each convolution's output in int8, which halves the
memory traffic of large batches. Adds have no parameter to name them: they are listed in
program order, which paddle2onnx keeps (``onnx_int8`` checks the count).
"""

import contextlib
import os
import tempfile

import numpy as np
import paddle

from paddle_resnet.core import feeds
from paddle_resnet.core.errors import ConfigError

# The ops whose inputs and weights are quantized, where a program has them (the legacy
# IR's ``qat.INT8_OP_TYPES``).
QUANTIZED_OPS = ("pd_op.conv2d", "pd_op.depthwise_conv2d", "pd_op.matmul")
# The calibration algorithms this module implements (Paddle's PostTrainingQuantization
# has KL, mse and emd too, on the legacy IR only).
PIR_PTQ_ALGOS = ("abs_max", "avg", "hist")
# hist: the range holding this share of the absolute values (Paddle's hist_percent)
HIST_PERCENT = 0.99999
HIST_BINS = 2048
# QAT's fake-quantize ops on PIR (paddle.quantization's quanters, paddle_internals)
FAKE_QUANTIZE_OPS = ("pd_op.fake_quantize_dequantize_moving_average_abs_max",)


def check_algo(algo):
    if algo not in PIR_PTQ_ALGOS:
        raise ConfigError(
            f"--ptq-algo {algo} on PIR: the toolkit calibrates PIR models with "
            f"{', '.join(PIR_PTQ_ALGOS)} (KL, mse and emd are Paddle's legacy-IR "
            "PostTrainingQuantization: export with --ir legacy)"
        )


def _quantized_ops(program):
    return [op for op in program.global_block().ops if op.name() in QUANTIZED_OPS]


def _weight_name(op):
    """The parameter ``op`` multiplies by, behind QAT's fake-quantize ops."""
    value = op.operand_source(1)
    producer = value.get_defining_op()
    while producer is not None and producer.name() in FAKE_QUANTIZE_OPS:
        value = producer.operand_source(0)
        producer = value.get_defining_op()
    return value.name if value.persistable else None


def _remove_fetch_ops(program):
    """Remove the fetch ops of a loaded ``program``; returns the values they fetched (the
    executor numbers fetches across both: the program's own answered for another value)."""
    fetched = []
    for op in [op for op in program.global_block().ops if op.name() == "pd_op.fetch"]:
        fetched.append(op.operand_source(0))
        op.erase()
    return fetched


def residual_adds(program):
    """The adds of ``program`` of two activations (a bias add has a parameter), in order."""
    return [
        op
        for op in program.global_block().ops
        if op.name() == "pd_op.add" and not any(op.operand_source(i).persistable for i in range(2))
    ]


def calibrate(loaded, batches, algo):
    """({weight name: the absolute range of its input}, [[both inputs' ranges] of each
    residual add]) over the image ``batches``, by ``algo``: abs_max, the largest absolute
    value seen; avg, the mean of each batch's; hist, the value below which ``HIST_PERCENT``
    of the absolute values lie (a second pass over a histogram up to abs_max)."""
    check_algo(algo)
    program, scope = loaded
    exe = paddle.static.Executor(paddle.CPUPlace())
    _remove_fetch_ops(program)
    with paddle.static.scope_guard(scope):
        found = ((_weight_name(op), op.operand_source(0)) for op in _quantized_ops(program))
        inputs = {name: value for name, value in found if name is not None}  # by weight name
        adds = residual_adds(program)
        values = list(inputs.values()) + [op.operand_source(i) for op in adds for i in range(2)]

        def each_batch():
            for images in batches:
                yield exe.run(program, feed={feeds.IMAGE: images}, fetch_list=values)

        maxima = np.array([[np.abs(a).max() for a in arrays] for arrays in each_batch()])
        ranges = maxima.mean(axis=0) if algo == "avg" else maxima.max(axis=0)
        if algo == "hist":
            histograms = np.zeros((len(values), HIST_BINS))
            for arrays in each_batch():
                for row, (array, top) in enumerate(zip(arrays, ranges)):
                    histograms[row] += np.histogram(np.abs(array), HIST_BINS, (0, top))[0]
            ranges = [_percentile_edge(h, top) for h, top in zip(histograms, ranges)]
    ranges = [float(r) for r in ranges]
    add_ranges = ranges[len(inputs) :]
    weighted = {name: r for name, r in zip(inputs, ranges) if r > 0}
    return weighted, [add_ranges[i : i + 2] for i in range(0, len(add_ranges), 2)]


def _percentile_edge(histogram, top):
    """The upper edge of the bin of ``histogram`` below which ``HIST_PERCENT`` lie."""
    cumulative = np.cumsum(histogram) / histogram.sum()
    bin_index = int(np.searchsorted(cumulative, HIST_PERCENT))
    return (bin_index + 1) * top / len(histogram)


def qat_ranges(loaded):
    """{weight name: the trained absolute range of its input} of a PIR QAT export."""
    program, scope = loaded
    ranges = {}
    for op in _quantized_ops(program):
        producer = op.operand_source(0).get_defining_op()
        name = _weight_name(op)
        if name is None or producer is None or producer.name() not in FAKE_QUANTIZE_OPS:
            continue
        scale = producer.operand_source(1)
        ranges[name] = float(np.array(scope.find_var(scale.name).get_tensor()).reshape(-1)[0])
    return ranges


@contextlib.contextmanager
def fp32_model(model_prefix, loaded):
    """The path prefix of an fp32 PIR export for paddle2onnx: ``model_prefix``, or a QAT
    export's program without the fake-quantize ops, in a temporary folder while in use."""
    program, scope = loaded
    fake = [op for op in program.global_block().ops if op.name() in FAKE_QUANTIZE_OPS]
    if not fake:
        yield model_prefix
        return
    for op in fake:
        op.result(0).replace_all_uses_with(op.operand_source(0))
        op.erase()
    outputs = _remove_fetch_ops(program)
    image = next(op.result(0) for op in program.global_block().ops if op.name() == "pd_op.data")
    with tempfile.TemporaryDirectory(prefix="pir-fp32-") as folder:
        prefix = os.path.join(folder, os.path.basename(model_prefix))
        exe = paddle.static.Executor(paddle.CPUPlace())
        paddle.static.save_inference_model(prefix, [image], outputs, exe, program=program)
        yield prefix
