"""Export to Paddle Inference and run it: agreement with the eval program, modes, bad input."""

import io
import json
import os
import shutil
import time

import numpy as np
import onnxruntime
import paddle
import paddle.inference as paddle_infer
import pytest
from paddle.inference import PrecisionType

from conftest import flat
from paddle_resnet.commands import inference
from paddle_resnet.core import feeds
from paddle_resnet.core.config import InferenceConfig, build_config
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.core.report import read_report
from paddle_resnet.data.dali import DataSplit, make_loader, open_split
from paddle_resnet.data.folder import scan_split
from paddle_resnet.deploy import dali_input, inference_modes, predictor
from paddle_resnet.deploy import export as exporting
from paddle_resnet.deploy import exported as exported_model
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import programs as program
from paddle_resnet.training.weights import into_program


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    config = build_config(
        dict(
            flat(trained),
            **{
                "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
                "inference.model_dir": str(out / "model"),
                "inference.export_log_path": str(out / "export.json"),
            },
        )
    )
    report = exporting.export(config)
    return config, report


def quiet():
    return open(os.devnull, "w")


@pytest.mark.gpu_wheel
def test_export_writes_model_classes_and_report(exported):
    config, report = exported
    model_dir = config.inference.model_dir
    for name in ("inference.pdmodel", "inference.pdiparams", "classes.json", "model.json"):
        assert os.path.getsize(os.path.join(model_dir, name)) > 0
    with open(config.inference.export_log_path) as handle:
        saved = json.load(handle)
    assert saved["arch"] == "resnet18" and saved["input_shape"] == [3, 32, 32]
    assert saved["files"]["inference.pdiparams"] > 40_000_000  # 11.2 M float32 weights
    with open(os.path.join(model_dir, "classes.json")) as handle:
        assert "coat" in json.load(handle).values()


def test_our_checkpoints_parameters_export_with_their_class_names(exported, tmp_path):
    """--from-pretrained-params <checkpoint>/3/model.pdparams: the classes are the
    checkpoint's (its meta.json), not the label numbers."""
    config, _ = exported
    weights = os.path.join(config.run.from_checkpoint, "3", "model.pdparams")
    exporting.export(
        build_config(
            dict(
                flat(config),
                **{
                    "run.from_checkpoint": None,
                    "run.from_pretrained_params": weights,
                    "inference.model_dir": str(tmp_path / "model"),
                    "inference.export_log_path": str(tmp_path / "export.json"),
                },
            )
        )
    )
    with open(os.path.join(tmp_path, "model", "classes.json")) as handle:
        classes = json.load(handle)
    with open(os.path.join(config.inference.model_dir, "classes.json")) as handle:
        assert classes == json.load(handle) and "coat" in classes.values()


@pytest.mark.gpu_wheel
def test_predictor_agrees_with_eval_program(exported, fmnist_root):
    config, _ = exported
    batch = next(
        iter(
            make_loader(
                DataSplit.of_images("val", scan_split(fmnist_root, "val")),
                config.data,
                "NCHW",
                False,
            )
        )
    )
    programs = program.build_programs(config, training=False)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(programs.startup)
    into_program.load_pretrained(
        programs.eval,
        ckpt.read_checkpoint(config.run.from_checkpoint)[1],
        config.run.from_checkpoint,
        config.model.arch,
    )
    expected = exe.run(programs.eval, feed=batch, fetch_list=[programs.eval_fetches["probs"]])[0]
    fp32 = build(config, cpu_precision="fp32")(batch[feeds.IMAGE])
    np.testing.assert_allclose(fp32, expected, atol=1e-4)
    np.testing.assert_allclose(fp32.sum(axis=1), 1.0, atol=1e-5)
    if not predictor.cpu_supports_bf16():  # e.g. AVX2-only CPUs
        with pytest.raises(ConfigError, match="no bfloat16 support"):
            build(config, cpu_precision="bf16")
        return
    bf16 = build(config, cpu_precision="bf16")(batch[feeds.IMAGE])
    assert (bf16.argmax(1) == fp32.argmax(1)).mean() >= 0.99


def build(config, **inference_values):
    values = dict(flat(config), **{f"inference.{k}": v for k, v in inference_values.items()})
    return inference_modes.build_classifier(build_config(values), 16)[0]


@pytest.mark.gpu_wheel
def test_accuracy_mode_matches_training_evaluation(exported, trained, tmp_path):
    config, _ = exported
    values = dict(
        flat(config),
        **{
            "inference.mode": "accuracy",
            "inference.log_path": str(tmp_path / "inf.json"),
            "data.batch_size": 32,
        },
    )
    result = inference_modes.run(build_config(values), quiet())
    val = [r for r in read_report(trained.report_file) if r["type"] == "VAL"][-1]["data"]
    assert result["images"] == 130
    assert result["top1"] == pytest.approx(val["val.top1"])
    # the same confusion matrix as training's last validation, in the report too
    evaluated = [r for r in read_report(trained.report_file) if r["type"] == "CLASSES"][-1]
    assert result["classes"]["confusion"] == evaluated["data"]["confusion"]
    assert result["balanced_top1"] == pytest.approx(evaluated["data"]["balanced_top1"])
    logged = [r for r in read_report(str(tmp_path / "inf.json")) if r["type"] == "CLASSES"]
    assert [r["data"] for r in logged] == [result["classes"]]
    # top-5 is not compared: an undertrained model's probabilities underflow to exact
    # zeros, whose order is arbitrary, while the eval program ranks logits.
    assert result["top5"] >= result["top1"]


def test_benchmark_mode_reports_latency_percentiles(exported, tmp_path):
    config, _ = exported
    log = tmp_path / "bench.json"
    values = dict(
        flat(config),
        **{
            "inference.mode": "benchmark",
            "inference.batch_sizes": (1, 4),
            "inference.use_synthetic": True,
            "inference.log_path": str(log),
            "run.benchmark_steps": 5,
            "run.benchmark_warmup_steps": 5,  # a new batch shape's first steps are slow
        },
    )
    started = time.perf_counter()
    rows = inference_modes.run(build_config(values), quiet())
    elapsed = time.perf_counter() - started
    assert [r["batch_size"] for r in rows] == [1, 4]
    for row in rows:
        percentiles = [row[f"latency_p{p}"] for p in (50, 90, 95, 99)]
        assert 0 < percentiles[0] and percentiles == sorted(percentiles)
        # Images per second, not batches or milliseconds: the 5 timed steps happened inside
        # this call, and throughput and average latency (ms) describe the same steps
        # (a typical step's p50 is not compared: a step stalled by another process skews
        # the average, not the median).
        assert row["ips"] >= 5 * row["batch_size"] / elapsed
        assert row["ips"] * row["latency_avg"] / 1000.0 == pytest.approx(row["batch_size"])
        assert row["input"] == "synthetic" and row["backend"] == "cpu"
    saved = [r["data"] for r in read_report(str(log)) if r["step"] == "BENCHMARK"]
    assert saved == rows


def test_predict_ranks_classes_and_agrees_with_accuracy_mode(exported, fmnist_root, tmp_path):
    """Predicting a validation tree (class folders, read recursively) gives the accuracy
    mode's top-1 and confusion matrix, since its folders are named after classes."""
    config, _ = exported
    values = dict(
        flat(config),
        **{
            "inference.mode": "predict",
            "inference.images": (os.path.join(fmnist_root, "val"),),
            "inference.log_path": str(tmp_path / "pred.json"),
        },
    )
    console = io.StringIO()
    predictions = inference_modes.run(build_config(values), console)
    assert len(predictions) == 130
    for entry in predictions:
        probabilities = [p["probability"] for p in entry["top"]]
        assert len(entry["top"]) == 5 and probabilities == sorted(probabilities, reverse=True)
        assert sum(probabilities) <= 1.0 + 1e-5
    hits = [
        entry["top"][0]["class"] == os.path.basename(os.path.dirname(entry["image"]))
        for entry in predictions
    ]
    accuracy = inference_modes.run(
        build_config(dict(values, **{"inference.mode": "accuracy"})), quiet()
    )
    assert sum(hits) == round(accuracy["top1"] * 130)
    lines = console.getvalue().splitlines()
    assert (
        f"130 of 130 images are in folders named after classes: top-1 {100 * sum(hits) / 130:.2f} %"
        in lines
    )
    assert any(line.startswith("per class: balanced top-1") for line in lines)
    per_class = [r for r in read_report(str(tmp_path / "pred.json")) if r["type"] == "CLASSES"]
    assert per_class[-1]["data"] == accuracy["classes"]


def fails_with(capsys, argv, message, log):
    assert inference.main(argv + ["--trt-log-path", str(log)]) == 2
    err = capsys.readouterr().err.strip()
    # The error is the last line; Paddle 3.x may print a banner about flags before it.
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in err and message in last, err


def test_bad_input(exported, capsys, tmp_path):
    config, _ = exported
    model_dir = config.inference.model_dir
    log = tmp_path / "inference.json"
    fails_with(capsys, ["--inference-dir", str(tmp_path / "none")], "does not exist", log)
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "inference.pdmodel").write_bytes(b"x")
    fails_with(capsys, ["--trt-inference-dir", str(partial)], "inference.pdiparams is missing", log)
    not_image = tmp_path / "notes.jpg"
    not_image.write_text("not an image")
    fails_with(
        capsys,
        ["--trt-inference-dir", model_dir, "--mode", "predict", "--images", str(not_image)],
        "1 of 1 images cannot be decoded as images",
        log,
    )
    fails_with(
        capsys,
        ["--trt-inference-dir", model_dir, "--batch-size", "0"],
        "data.batch_size (--batch-size) must be at least 1",
        log,
    )
    fails_with(
        capsys,
        ["--trt-inference-dir", model_dir, "--backend", "cpu", "--trt-precision", "INT8"],
        "--trt-precision INT8 needs --backend trt",
        log,
    )
    classifier = build(config)
    with pytest.raises(
        Exception, match=r"does not fit the model, which takes \[batch, 3, 32, 32\]"
    ):
        classifier(np.zeros((2, 3, 224, 224), np.float32))


def test_predict_keeps_the_good_images_and_names_the_bad(exported, fmnist_root, tmp_path, capsys):
    config, _ = exported
    folder = tmp_path / "mixed"
    shutil.copytree(os.path.join(fmnist_root, "val", "bag"), folder)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 truncated")
    assert (
        inference.main(
            [
                "--inference-dir",
                config.inference.model_dir,
                "--mode",
                "predict",
                "--images",
                str(folder),
                "--inference-log-path",
                str(tmp_path / "log.json"),
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    predicted = [line for line in captured.out.splitlines() if line.startswith(str(folder))]
    assert (
        len(predicted) == 14
        and "broken.jpg: cannot be decoded as an image; skipped" in predicted[0]
    )
    assert captured.err.strip().splitlines()[-1] == (
        f"error: 1 of 14 images cannot be decoded as images, e.g. {folder / 'broken.jpg'}"
    )


def trt_engine(settings, shape=(3, 224, 224), max_batch=64, quantized=False):
    """(the TensorRT engine's settings, the dynamic shapes) the trt backend asks of Paddle."""
    calls = {
        call.method: call
        for call in predictor.predictor_settings(
            settings, "trt", list(shape), max_batch, quantized=quantized
        )
    }
    assert calls["enable_use_gpu"].args[1] == settings.device_id
    assert "enable_mkldnn" not in calls  # TensorRT, not oneDNN
    return dict(calls["enable_tensorrt_engine"].kwargs), calls["set_trt_dynamic_shape_info"].args


@pytest.mark.gpu_wheel
def test_tensorrt_settings_without_a_gpu():
    """The TensorRT path cannot run here, and the CPU build refuses every TensorRT call
    (the GPU build's own Config takes them: the next test). What the settings must do:
    NVIDIA's inference script gives --trt-workspace-size in bytes (1073741824), the
    toolkit's help in MB: both are one GiB; the engine takes every batch from 1 to the
    largest the run feeds, in the model's layout; INT8 is calibrated by TensorRT only for
    a model without scales; the CPU precisions need a CPU backend."""
    gib = 1 << 30
    assert trt_engine(InferenceConfig(trt_workspace_size=gib))[0]["workspace_size"] == gib
    assert trt_engine(InferenceConfig(trt_workspace_size=1024))[0]["workspace_size"] == gib
    fp16, shapes = trt_engine(InferenceConfig(trt_precision="FP16"), (224, 224, 3), max_batch=8)
    assert fp16["precision_mode"] == PrecisionType.Half and fp16["max_batch_size"] == 8
    smallest, _, largest = (shape[feeds.IMAGE] for shape in shapes)
    assert smallest == [1, 224, 224, 3] and largest == [8, 224, 224, 3]
    int8 = InferenceConfig(trt_precision="INT8", trt_use_calib_mode=True)
    assert trt_engine(int8)[0]["precision_mode"] == PrecisionType.Int8
    assert trt_engine(int8)[0]["use_calib_mode"] is True  # no scales: TensorRT calibrates
    assert trt_engine(int8, quantized=True)[0]["use_calib_mode"] is False  # the model's own
    with pytest.raises(ConfigError, match="INT8 needs a model with quantization scales"):
        trt_engine(InferenceConfig(trt_precision="INT8"))
    with pytest.raises(ConfigError, match="needs --backend cpu"):
        trt_engine(InferenceConfig(cpu_precision="bf16"))


@pytest.mark.cuda_build
@pytest.mark.gpu_wheel
@pytest.mark.parametrize(
    "precision, mode",
    [("FP32", PrecisionType.Float32), ("FP16", PrecisionType.Half), ("INT8", PrecisionType.Int8)],
)
def test_tensorrt_settings_apply_to_a_real_config(exported, precision, mode):
    """The GPU build takes every TensorRT call (no GPU needed to configure) and reports
    what a predictor would run."""
    config, _ = exported
    real = paddle_infer.Config(*exported_model.model_paths(config.inference.model_dir))
    for call in predictor.predictor_settings(
        InferenceConfig(trt_precision=precision, trt_use_static=True, device_id=1),
        "trt",
        [3, 32, 32],
        8,
        quantized=precision == "INT8",
    ):
        call.apply(real)
    assert real.use_gpu() and real.gpu_device_id() == 1
    assert real.tensorrt_engine_enabled() and real.tensorrt_dynamic_shape_enabled()
    assert real.tensorrt_precision_mode() == mode


@pytest.mark.gpu_wheel
def test_cpu_settings_apply_to_a_real_config(exported):
    config, _ = exported
    real = paddle_infer.Config(*exported_model.model_paths(config.inference.model_dir))
    precision = "bf16" if predictor.cpu_supports_bf16() else "fp32"
    for call in predictor.predictor_settings(
        InferenceConfig(cpu_precision=precision, cpu_threads=2), "cpu", [3, 32, 32], 8
    ):
        call.apply(real)
    assert real.mkldnn_enabled() and not real.use_gpu()
    assert real.cpu_math_library_num_threads() == 2


def test_nhwc_export_equals_nchw(exported, tmp_path):
    """An NHWC model (same weights as the NCHW one) exports and predicts the same."""
    config, _ = exported
    nhwc = build_config(
        dict(
            flat(config),
            **{
                "model.data_layout": "NHWC",
                "inference.model_dir": str(tmp_path / "nhwc"),
                "inference.export_log_path": str(tmp_path / "nhwc.json"),
            },
        )
    )
    report = exporting.export(nhwc)
    assert report["layout"] == "NHWC" and report["input_shape"] == [32, 32, 3]
    images = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype("float32")
    expected = build(config)(images)
    actual = build(nhwc)(images.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(actual, expected, atol=1e-4)


def test_failed_export_keeps_the_previous_one(exported, monkeypatch):
    config, _ = exported
    model_dir = config.inference.model_dir
    before = {
        name: open(os.path.join(model_dir, name), "rb").read() for name in os.listdir(model_dir)
    }

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed during export")

    monkeypatch.setattr(paddle.static, "save_inference_model", crash)
    with pytest.raises(KeyboardInterrupt):
        exporting.export(config)
    after = {
        name: open(os.path.join(model_dir, name), "rb").read() for name in os.listdir(model_dir)
    }
    assert after == before
    assert not [n for n in os.listdir(os.path.dirname(model_dir)) if ".partial-" in n]


def test_onnx_export_equals_the_paddle_model(exported, tmp_path):
    """--onnx writes model.onnx beside the Paddle model; onnxruntime gives the Paddle
    predictor's probabilities on real validation images (measured: within 2e-6)."""
    config, _ = exported
    onnx_config = build_config(
        dict(
            flat(config),
            **{
                "inference.model_dir": str(tmp_path / "model"),
                "inference.onnx": True,
                "inference.export_log_path": str(tmp_path / "export.json"),
            },
        )
    )
    report = exporting.export(onnx_config)
    assert report["files"]["model.onnx"] > 40_000_000
    session = onnxruntime.InferenceSession(
        str(tmp_path / "model" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    classifier, info, _ = inference_modes.build_classifier(onnx_config, 16)
    batch = next(
        iter(dali_input.validation_batches(open_split(config.data, "val"), config.data, info))
    )
    paddle_probs = classifier(batch[feeds.IMAGE])
    onnx_probs = session.run(None, {session.get_inputs()[0].name: batch[feeds.IMAGE]})[0]
    np.testing.assert_allclose(onnx_probs, paddle_probs, atol=1e-4)
