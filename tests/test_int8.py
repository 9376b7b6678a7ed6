"""INT8 by post-training quantization: export with --ptq-algo, run with --cpu-precision
int8 (oneDNN), on real images; and the refusals."""

import json
import os

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime
import pytest

from conftest import flat, small_config
from paddle_resnet.commands import train
from paddle_resnet.core import devices, feeds, optional
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.data.dali import open_split
from paddle_resnet.deploy import dali_input, inference_modes, onnx_int8
from paddle_resnet.deploy import export as exporting
from paddle_resnet.deploy import exported as exported_model

needs_int8_cpu = pytest.mark.skipif(
    not devices.cpu_has_int8_dot_products(), reason="this CPU has no int8 dot products"
)


def export_config(trained, out, **values):
    return build_config(
        dict(
            flat(trained),
            **{
                "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
                "inference.model_dir": str(out),
                "inference.export_log_path": str(out) + ".json",
            },
            **values,
        )
    )


@pytest.fixture(scope="module")
def learned(fmnist_root, tmp_path_factory):
    """A model that has learned something (55 % top-1 on the 130 validation images in
    6 epochs at LR 0.05): the suite's shared ``trained`` model is at chance, where int8
    rounding flips near-uniform predictions and agreement means little."""
    config = small_config(
        fmnist_root,
        tmp_path_factory.mktemp("learned"),
        **{"lr.base": 0.05, "run.epochs": 6, "run.run_scope": "train_only"},
    )
    train.run(config, report_stream=open(os.devnull, "w"))
    return config


@pytest.fixture(scope="module")
def models(learned, tmp_path_factory):
    """The learned model exported in fp32, and quantized on 64 training images (hist:
    on the demo model it kept top-1 within 0.1 point; KL lost 3.8)."""
    out = tmp_path_factory.mktemp("int8")
    fp32 = export_config(learned, out / "fp32")
    exporting.export(fp32)
    int8 = export_config(
        learned,
        out / "int8",
        **{
            "inference.ptq_algo": "hist",
            "inference.calibration_images": 64,
            "inference.onnx": optional.has_int8_onnx,
        },
    )
    exporting.export(int8)
    return fp32, int8


def probabilities(config, precision):
    """Probabilities of every validation image, and the labels."""
    config = build_config(
        dict(flat(config), **{"inference.cpu_precision": precision, "inference.backend": "cpu"})
    )
    classifier, info, _ = inference_modes.build_classifier(config, config.data.batch_size)
    outputs, labels = [], []
    for batch in dali_input.validation_batches(open_split(config.data, "val"), config.data, info):
        outputs.append(classifier(batch[feeds.IMAGE]))
        labels.append(batch[feeds.LABEL].ravel())
    return np.concatenate(outputs), np.concatenate(labels)


def test_ptq_model_records_its_calibration_and_holds_int8_scales(models):
    _, int8 = models
    info = exported_model.read_info(int8.inference.model_dir)
    assert info["quantization"] == {
        "method": "ptq",
        "algo": "hist",
        "calibration_images": 64,
        "calibration_data": "training images, validation preprocessing",
        "weights": "int8, channel-wise abs-max",
        "activations": "int8, hist",
        "ops": ["conv2d", "matmul_v2"],  # what ResNet holds of what int8 quantizes
    }
    with open(os.path.join(int8.inference.model_dir, "inference.pdmodel"), "rb") as handle:
        program = handle.read()
    assert b"quantize" in program  # quantize/dequantize ops with the scales


@needs_int8_cpu
def test_int8_predictor_agrees_with_fp32_on_real_images(models):
    """The 130 validation images: top-1 agreement >= 90 % and top-1 within 5 points.
    Measured: 96.9 % (2.6.2) / 96.2 % (3.3.1) agreement, top-1 55.4 -> 53.8 %; the same
    model calibrated with KL agreed on only 73-75 %, so the bound tells them apart."""
    fp32, int8 = models
    probs32, labels = probabilities(fp32, "fp32")
    probs8, labels8 = probabilities(int8, "int8")
    np.testing.assert_array_equal(labels, labels8)
    assert len(labels) == 130
    agreement = float((probs32.argmax(1) == probs8.argmax(1)).mean())
    assert agreement >= 0.9, agreement
    top1_fp32, top1_int8 = ((p.argmax(1) == labels).mean() for p in (probs32, probs8))
    assert top1_int8 >= top1_fp32 - 0.05 and top1_fp32 > 0.4, (top1_fp32, top1_int8)
    np.testing.assert_allclose(probs8.sum(1), 1.0, atol=1e-3)  # still probabilities


def test_int8_refuses_a_model_without_scales(models):
    fp32, _ = models
    with pytest.raises(ConfigError, match="INT8 needs a model with quantization scales"):
        probabilities(fp32, "int8")


@pytest.mark.skipif(
    optional.has_int8_onnx or not optional.has_paddle2onnx, reason="paddle2onnx 2.x only"
)
def test_int8_onnx_with_paddle2onnx_2_is_refused_before_any_work(learned, tmp_path):
    """paddle2onnx 2.x (Paddle 3) converts Paddle's quantize ops as float8 only and
    aborts the whole process on an int8 model: refused first, in one line."""
    config = export_config(
        learned,
        tmp_path / "int8",
        **{"inference.ptq_algo": "hist", "inference.calibration_images": 8, "inference.onnx": True},
    )
    with pytest.raises(
        UserError, match=r"an int8 legacy-IR model to ONNX .* needs paddle2onnx 1.2.11"
    ):
        exporting.export(config)
    assert not os.path.exists(tmp_path / "int8")


def test_ptq_bad_inputs_are_one_line(trained, tmp_path):
    with pytest.raises(ConfigError, match="ptq_algo.*must be one of KL, hist, mse, avg, abs_max"):
        export_config(trained, tmp_path / "m", **{"inference.ptq_algo": "best"})
    with pytest.raises(ConfigError, match="calibration_images"):
        export_config(
            trained,
            tmp_path / "m",
            **{"inference.ptq_algo": "KL", "inference.calibration_images": 0},
        )
    too_many = export_config(
        trained,
        tmp_path / "m",
        **{"inference.ptq_algo": "abs_max", "inference.calibration_images": 10_000},
    )
    with pytest.raises(ConfigError, match="the calibration data hold only 160"):
        exporting.export(too_many)
    assert not os.path.exists(tmp_path / "m")  # nothing half-written


def test_cpu_without_int8_dot_products_is_refused(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse2 avx2 avx512f\n")
    assert not devices.cpu_has_int8_dot_products(str(cpuinfo))
    cpuinfo.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert devices.cpu_has_int8_dot_products(str(cpuinfo))


def test_export_report_carries_the_quantization(models):
    _, int8 = models
    with open(int8.inference.export_log_path) as handle:
        assert json.load(handle)["quantization"]["algo"] == "hist"


@pytest.mark.skipif(not optional.has_int8_onnx, reason="paddle2onnx 2.x converts no int8 model")
def test_the_quantized_onnx_model_agrees_with_fp32(models):
    """--onnx on a PTQ model: onnxruntime runs its QDQ graph on the 130 validation
    images, and its top-1 agrees with the fp32 Paddle model as often as oneDNN int8's
    does (>= 90 %; measured: see the int8 predictor test)."""
    fp32, int8 = models
    probs32, labels = probabilities(fp32, "fp32")
    session = onnxruntime.InferenceSession(
        os.path.join(int8.inference.model_dir, exported_model.ONNX_FILE),
        providers=["CPUExecutionProvider"],
    )
    info = exported_model.read_info(int8.inference.model_dir)
    top = np.concatenate(
        [
            session.run(None, {session.get_inputs()[0].name: batch[feeds.IMAGE]})[0].argmax(1)
            for batch in dali_input.validation_batches(
                open_split(int8.data, "val"), int8.data, info
            )
        ]
    )
    agreement = float((top == probs32.argmax(1)).mean())
    assert agreement >= 0.9, agreement
    # the CPU's int8 form (deploy/onnx_int8.py): ReLU outputs quantized unsigned, and
    # ReLUs read their convolution or add directly, not a requantized copy
    graph = onnx.load(os.path.join(int8.inference.model_dir, exported_model.ONNX_FILE)).graph
    producers = {output: node.op_type for node in graph.node for output in node.output}
    dtypes = {i.name: onnx.numpy_helper.to_array(i).dtype for i in graph.initializer}
    after_relu = [
        n
        for n in graph.node
        if n.op_type == "QuantizeLinear" and producers.get(n.input[0]) == "Relu"
    ]
    assert after_relu and all(dtypes.get(n.input[2]) == np.uint8 for n in after_relu)
    relu_inputs = [producers[n.input[0]] for n in graph.node if n.op_type == "Relu"]
    assert relu_inputs and set(relu_inputs) <= {"Conv", "Add"}, set(relu_inputs)
    # the classifier in int8 too: paddle2onnx writes it in fp32, the export restores
    # its input's u8 quantization and its int8 weight from the Paddle model's ranges
    (classifier,) = [n for n in graph.node if n.op_type == "MatMul"]
    assert [producers[name] for name in classifier.input] == ["DequantizeLinear"] * 2
    weight_dequantize = next(n for n in graph.node if n.output[0] == classifier.input[1])
    assert dtypes[weight_dequantize.input[0]] == np.int8


def test_a_max_pools_quantization_moved_in_front_of_it_changes_no_value(tmp_path):
    """onnx_int8's max-pool rewrite (PIR int8 exports): ReLU -> max pool -> quantize pair
    -> convolution becomes ReLU -> quantize pair -> max pool -> convolution, and ONNX
    Runtime computes the very same output (max and a quantization commute)."""
    helper = onnx.helper
    scale = onnx.numpy_helper.from_array(np.asarray(0.05, np.float32), "scale")
    zero = onnx.numpy_helper.from_array(np.asarray(0, np.int8), "zero")
    weight = onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "weight"
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["relu"]),
        helper.make_node("MaxPool", ["relu"], ["pool"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("QuantizeLinear", ["pool", "scale", "zero"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"]),
        helper.make_node("Conv", ["dq", "weight"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pool",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [scale, zero, weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    images = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32) * 4

    def served(onnx_model):
        session = onnxruntime.InferenceSession(onnx_model.SerializeToString())
        return session.run(None, {"x": images})[0]

    before = served(model)
    assert onnx_int8._quantize_before_max_pool(onnx_int8._Graph(model.graph)) == 1
    onnx_int8._sort_topologically(onnx_int8._Graph(model.graph))
    rewritten = onnx_int8._Graph(model.graph)
    (pool,) = [node for node in model.graph.node if node.op_type == "MaxPool"]
    assert rewritten.producers[pool.input[0]].op_type == "DequantizeLinear"
    assert [node.op_type for node in rewritten.consumers["relu"]] == ["QuantizeLinear"]
    np.testing.assert_array_equal(served(model), before)
