"""The toolkit on Paddle's new IR (PIR, ``--ir pir``): the same model, data, checkpoints
and reports as the legacy IR, with the toolkit's own 2:4 masks, QAT and gradient
all-reduce where Paddle offers none on PIR. Runs on Paddle 3.x (the 3.3.1 track); on
2.6 only the refusal."""

import collections
import os
import subprocess
import sys

import numpy as np
import onnx
import paddle
import pytest
from paddle.incubate import asp

from conftest import PADDLE3, ROOT, flat, pir_rehearsal, run_python, small_config
from paddle_resnet.commands import inference, program, train
from paddle_resnet.core import bootstrap, devices, feeds, paddle_internals
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.core.report import read_report
from paddle_resnet.deploy import export as exporting
from paddle_resnet.deploy import exported, onnx_int8, pir_tensorrt, predictor, sparsity_report
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import ir, programs, qat, run_folder
from paddle_resnet.training.loop import train_step
from paddle_resnet.training.sparsity import pattern

pir_only = pytest.mark.skipif(not PADDLE3, reason="PIR needs Paddle 3")


@pytest.mark.parametrize("algo", sorted(pattern.MASK_ALGOS))
@pytest.mark.parametrize("shape", [(64, 32, 3, 3), (32, 24, 1, 1), (512, 10), (8, 3, 7, 7)])
def test_own_masks_equal_paddle_asp(algo, shape):
    """The toolkit's mask algorithms give Paddle ASP's masks on the same weights (ties,
    zeros and padding included), so a model pruned on either IR looks alike."""
    rng = np.random.default_rng(sum(shape))
    weight = rng.standard_normal(shape).astype("float32")
    weight[rng.random(shape) < 0.1] = 0.0
    ours = pattern.prune_mask(weight, algo, pattern.NVIDIA_2_4)
    if (weight.shape[1] if weight.ndim == 4 else weight.shape[0]) < 4:
        assert (ours == 1).all()  # too few input channels: kept dense, as ASP does
        return
    theirs = asp.create_mask(weight.T, func_name=asp.MaskAlgo[algo.upper()], n=2, m=4).T
    np.testing.assert_array_equal(ours, theirs)
    assert pattern.holds(weight * ours, pattern.NVIDIA_2_4)


@pytest.mark.skipif(PADDLE3, reason="refusal on Paddle 2.6")
def test_pir_is_refused_on_paddle_2():
    with pytest.raises(ConfigError, match="--ir pir needs Paddle 3.x"):
        ir.check(build_config({"run.ir": "pir"}))


@pir_only
@pytest.mark.parametrize(
    "values, message",
    [
        ({"run.sync_bn": True}, "--sync-bn is built on the legacy IR only"),
    ],
)
def test_what_pir_cannot_do_is_refused_naming_the_ir_that_can(values, message):
    with pytest.raises(ConfigError, match=message):
        ir.check(build_config(dict(values, **{"run.ir": "pir"})))


def test_bf16_amp_on_the_legacy_ir_is_refused_naming_pir():
    config = build_config({"amp.enabled": True, "amp.dtype": "bfloat16", "run.ir": "legacy"})
    with pytest.raises(
        ConfigError, match="--amp-dtype bfloat16 is built on PIR only: use --ir pir"
    ):
        ir.check(config)


@pir_only
@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="refusals of the CPU build")
@pytest.mark.parametrize(
    "values, message",
    [
        ({}, "--amp with float16 on PIR needs the GPU build of Paddle"),
        (
            {"amp.dtype": "bfloat16", "amp.use_pure_fp16": True},
            "--use-pure-fp16 with bfloat16 on PIR needs the GPU build",
        ),
        (
            {"amp.dtype": "bfloat16", "amp.use_dynamic_loss_scaling": True},
            "--use-dynamic-loss-scaling is for float16",
        ),
    ],
)
def test_amp_this_build_cannot_run_on_pir_is_one_line(values, message):
    """PIR checks kernel dtypes as it builds: what would fail inside Paddle is refused first."""
    with pytest.raises(ConfigError, match=message):
        ir.check(build_config(dict(values, **{"run.ir": "pir", "amp.enabled": True})))


@pir_only
def test_bf16_amp_trains_on_pir_with_fp32_weights_and_fp32_evaluation():
    """O1 bf16, the AMP a CPU can run on PIR: the train program computes its convolutions
    in bf16 on oneDNN (forward and backward, the kernel's data type bf16: Paddle's own
    fallback ran them in fp32), its batch norms in fp32, the weights stay fp32
    (checkpoints fit fp32 programs) and the eval program is fp32. A static loss scale
    takes the very steps no scale takes: Paddle 3.3.1's PIR GradScaler divides the
    gradients by a static scale it never multiplied the loss by, so the toolkit scales
    the loss itself."""
    rng = np.random.default_rng(0)
    feed = {
        "data": rng.random((8, 3, 32, 32)).astype("float32"),
        "label": rng.integers(0, 10, (8, 1)).astype("int64"),
    }
    losses = {}
    for scale in (1.0, 128.0):
        config = build_config(
            {
                "model.arch": "resnet18",
                "model.num_classes": 10,
                "data.crop_size": 32,
                "lr.warmup_epochs": 0.0,
                "run.ir": "pir",
                "amp.enabled": True,
                "amp.dtype": "bfloat16",
                "amp.scale_loss": scale,
            }
        )
        if not predictor.cpu_supports_bf16():  # e.g. an AVX2-only EPYC: one line instead
            with pytest.raises(ConfigError, match="needs AVX512-BF16 or AMX, which this CPU"):
                devices.check_training_options(config)
            return
        with ir.selected(config), paddle.static.scope_guard(paddle.static.Scope()):
            built = programs.build_programs(config, steps_per_epoch=10, global_batch=8)
            assert programs.applied_strategies(built.train)["AMP"]
            assert not ir.computes_in_low_precision(built.eval)
            assert {str(p.dtype) for p in ir.parameters(built.train)} == {"paddle.float32"}
            ops = built.train.global_block().ops
            convolutions = [op for op in ops if op.name() == "onednn_op.conv2d"]
            assert len(convolutions) == 20  # ResNet-18's, every one
            for op in convolutions:
                assert op.attrs()["onednn_data_type"] == "bfloat16"
                assert {str(op.operand_source(i).dtype) for i in (0, 1)} == {"paddle.bfloat16"}
            gradients = [op for op in ops if op.name() == "onednn_op.conv2d_grad"]
            assert len(gradients) == 20
            assert all(str(op.operand_source(2).dtype) == "paddle.bfloat16" for op in gradients)
            norms = [op for op in ops if op.name().startswith("pd_op.batch_norm")]
            assert len(norms) == 40  # forward and backward, plain kernels
            assert {str(op.operand_source(0).dtype) for op in norms} == {"paddle.float32"}
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(built.startup)
            losses[scale] = [train_step(exe, built, feed)["loss"] for _ in range(4)]
    np.testing.assert_allclose(losses[128.0], losses[1.0], rtol=1e-6)
    assert losses[1.0][-1] < losses[1.0][0]


@pir_only
def test_bf16_amp_convolutions_run_bf16_onednn_primitives(fmnist_root, tmp_path):
    """What ran, from oneDNN's own log (ONEDNN_VERBOSE) of one step of ``train.py --amp
    --amp-dtype bfloat16``: every convolution primitive, forward and both backward ones,
    took bf16 sources (on AMX where the CPU has it); Paddle's fallback had run the forward
    ones on fp32 sources."""
    if not predictor.cpu_supports_bf16():
        pytest.skip("bf16 AMP needs AVX512-BF16 or AMX (refused in one line: the test above)")
    result = subprocess.run(
        [
            sys.executable, "train.py", "--model-arch-name", "resnet18", "--num-of-class",
            "10", "--image-root", fmnist_root, "--output-dir", str(tmp_path / "out"),
            "--crop-size", "32", "--resize-short", "32", "--batch-size", "16", "--amp",
            "--amp-dtype", "bfloat16", "--benchmark", "--benchmark-steps", "1",
            "--benchmark-warmup-steps", "0",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, ONEDNN_VERBOSE="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    runs = [
        line.split(",") for line in result.stdout.splitlines() if ",exec,cpu,convolution," in line
    ]
    kinds = collections.Counter(fields[7] for fields in runs)
    assert kinds == {"forward_inference": 20, "backward_data": 20, "backward_weights": 20}, kinds
    sources = {fields[8].split()[0].split(":")[1] for fields in runs}
    assert sources == {"bf16"}, sources


@pir_only
def test_both_irs_take_the_same_steps_from_the_same_seed():
    """Same model code, seed and batch: the PIR program's losses follow the legacy
    program's (float sums in another order aside), and both name their parameters
    alike, so checkpoints move between them."""
    rng = np.random.default_rng(0)
    feed = {
        "data": rng.random((8, 3, 32, 32)).astype("float32"),
        "label": rng.integers(0, 10, (8, 1)).astype("int64"),
    }
    losses, names = {}, {}
    for name in ("legacy", "pir"):
        config = build_config(
            {
                "model.arch": "resnet18",
                "model.num_classes": 10,
                "data.crop_size": 32,
                "lr.warmup_epochs": 0.0,
                "run.ir": name,
                "run.cpu_onednn": False,  # plain kernels on both: the same sums
            }
        )
        with ir.selected(config), paddle.static.scope_guard(paddle.static.Scope()):
            built = programs.build_programs(config, steps_per_epoch=10, global_batch=8)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(built.startup)
            losses[name] = [train_step(exe, built, feed)["loss"] for _ in range(4)]
            names[name] = ir.persistable_names(built.train)
    assert names["legacy"] == names["pir"]
    np.testing.assert_allclose(losses["pir"], losses["legacy"], rtol=1e-4)
    assert losses["pir"][-1] < losses["pir"][0]


@pir_rehearsal
@pir_only
def test_pir_prunes_trains_exports_json_and_serves(fmnist_root, tmp_path, capsys):
    """2:4 on PIR end to end: pruned by the toolkit, the pattern held by the in-program
    masks through training, saved with the checkpoint, exported as inference.json with
    its weights 2:4, and served by Paddle Inference at the accuracy training measured."""
    config = small_config(
        fmnist_root,
        tmp_path / "out",
        **{
            "run.ir": "pir",
            "run.epochs": 1,
            "asp.enabled": True,
            "asp.prune_model": True,
            "inference.model_dir": str(tmp_path / "model"),
            "inference.onnx": True,
        },
    )
    metrics = train.run(config, report_stream=open(os.devnull, "w"))
    records = read_report(config.report_file)
    layers = next(r for r in records if r["type"] == "PARAMETER" and "layers" in r["data"])
    pruned = [row for row in layers["data"]["layers"] if row["status"] == "pruned"]
    assert len(pruned) == 19  # every conv but the first (3 input channels); fc kept dense
    model_dir = str(tmp_path / "model")
    assert os.path.isfile(os.path.join(model_dir, exported.PIR_MODEL_FILE))
    assert not os.path.exists(os.path.join(model_dir, exported.MODEL_FILE))
    assert sparsity_report.report(model_dir) == []
    saved = ckpt.read_checkpoint(run_folder.checkpoint_dir(str(tmp_path / "out"), "resnet18", 1))[1]
    assert len(pattern.sparse_parameters(saved)) == 19
    # paddle2onnx 2.x's default constant folding pip-installs packages (numpy 2) into
    # the running environment: the export takes the path that installs nothing
    assert os.environ.get("POLYGRAPHY_AUTOINSTALL_DEPS") != "1"
    argv = ["--inference-dir", model_dir, "--mode", "accuracy", "--image-root", fmnist_root]
    # ONNX Runtime and OpenVINO read model.onnx, written by paddle2onnx 2.x from the .json
    # (OpenVINO reads no .json itself)
    for backend in ("cpu", "onnxruntime", "openvino"):
        capsys.readouterr()
        assert inference.main([*argv, "--backend", backend]) == 0
        out = capsys.readouterr().out
        assert f"top1 {metrics['val.top1']:.5g}" in out, (backend, out)
    if predictor.cpu_supports_bf16():  # oneDNN bf16 on the .json: within 2 of 130 images
        assert inference.main([*argv, "--backend", "cpu", "--cpu-precision", "bf16"]) == 0
        top1 = float(capsys.readouterr().out.split(" top1 ")[1].split()[0])
        assert abs(top1 - metrics["val.top1"]) <= 2 / 130 + 1e-9, top1
    served_by_paddle_2(model_dir, argv, metrics["val.top1"])


def served_by_paddle_2(model_dir, argv, top1):
    """The same PIR export in the test suite's Paddle 2.6 environment, as a team that trains
    on one Paddle and deploys on another meets it: Paddle Inference refuses it in one line
    naming Paddle 3 and the backends that can serve it (it crashed with a segmentation
    fault), ONNX Runtime serves its model.onnx at the same top-1, and check_sparsity
    checks model.onnx."""
    python = os.path.join(ROOT, ".venv", "bin", "python")
    if not os.path.exists(python):
        return  # one environment only (scripts/test.sh makes both)
    run = lambda *args: subprocess.run(  # noqa: E731
        [python, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    refused = run("inference.py", *argv, "--backend", "cpu")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {model_dir}: exported from PIR (inference.json), which Paddle 2.6.2 cannot "
        "read: use Paddle 3, or serve its model.onnx here with --backend onnxruntime or openvino"
    )
    served = run("inference.py", *argv, "--backend", "onnxruntime")
    assert served.returncode == 0 and f"top1 {top1:.5g}" in served.stdout, served.stderr[-2000:]
    checked = run("-m", "paddle_resnet.commands.check_sparsity", model_dir)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert "19 weights marked sparse, 0 violate 2:4" in checked.stdout, checked.stdout


@pir_only
def test_a_legacy_checkpoint_resumes_on_pir_as_on_legacy_and_exports(trained, tmp_path):
    """Checkpoints move between the IRs where the parameters match: the legacy
    checkpoint's next epoch on PIR ends where the same epoch on the legacy IR does, and
    the result exports from PIR."""
    metrics = {}
    for name in ("legacy", "pir"):
        resumed = build_config(
            dict(
                flat(trained),
                **{
                    "run.ir": name,
                    "run.epochs": 4,
                    "run.cpu_onednn": False,  # plain kernels on both: the same sums
                    "run.output_dir": str(tmp_path / name),
                    "run.from_checkpoint": run_folder.checkpoint_dir(
                        trained.run.output_dir, "resnet18", 3
                    ),
                },
            )
        )
        metrics[name] = train.run(resumed, report_stream=open(os.devnull, "w"))
    assert metrics["pir"]["val.top1"] == metrics["legacy"]["val.top1"]
    np.testing.assert_allclose(metrics["pir"]["val.loss"], metrics["legacy"]["val.loss"], rtol=1e-3)
    export = build_config(
        dict(
            flat(resumed),
            **{
                "run.from_checkpoint": run_folder.checkpoint_dir(
                    str(tmp_path / "pir"), "resnet18", 4
                ),
                "inference.model_dir": str(tmp_path / "model"),
            },
        )
    )
    assert exporting.export(export)["files"]["inference.json"] > 0


@pir_only
def test_program_py_shows_the_pir_programs(capsys):
    argv = ["--config", "resnet18_demo", "--ir", "pir", "--asp", "--qat"]
    assert program.main(argv) == 0
    out = capsys.readouterr().out
    assert "strategies applied: ASP, QAT" in out
    assert "fake_quantize_dequantize_moving_average_abs_max" in out


def toy_pir_export(folder):
    """A PIR inference.json of a tiny model that upsamples by a list of scales."""
    paddle.enable_static()
    with paddle_internals.static_ir(True):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            image = paddle.static.data("image", [-1, 3, 8, 8], "float32")
            scaled = paddle.nn.functional.interpolate(image, scale_factor=[2.0, 2.0])
            logits = paddle.flatten(paddle.nn.Conv2D(3, 2, 3)(scaled), 1)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        paddle.static.save_inference_model(
            str(folder / exported.PREFIX), [image], [logits], exe, program=main
        )


@pir_only
def test_a_model_paddle_3_onednn_cannot_run_falls_back_with_a_notice(tmp_path, capsys):
    """Paddle #77340: on 3.3 oneDNN's PIR instructions reject a list-of-doubles attribute
    (interpolate's scales) at the first run. fp32 falls back to the plain kernels with one
    line, giving the plain kernels' output; int8 and bf16, which need oneDNN, are refused."""
    toy_pir_export(tmp_path)
    images = np.random.RandomState(0).rand(2, 3, 8, 8).astype(np.float32)
    fp32 = build_config({}).inference
    calls = predictor.predictor_settings(fp32, "cpu", (3, 8, 8), 2, pir_export=True)
    plain = [c for c in calls if c.method != "enable_mkldnn"] + [
        predictor.ConfigCall("disable_mkldnn")
    ]
    expected = predictor.Classifier(str(tmp_path), plain, (3, 8, 8))(images)
    capsys.readouterr()
    np.testing.assert_allclose(
        predictor.Classifier(str(tmp_path), calls, (3, 8, 8))(images), expected, atol=1e-6
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"warning: {tmp_path}: Paddle {paddle.__version__}'s oneDNN cannot run this model "
        "(Paddle #77340): running Paddle's plain CPU kernels (slower)"
    ]
    bf16 = calls + [predictor.ConfigCall("enable_mkldnn_bfloat16")]
    with pytest.raises(UserError, match=r"#77340\); run it in fp32 or with --backend openvino"):
        predictor.Classifier(str(tmp_path), bf16, (3, 8, 8))(images)


def test_paddle_trt_for_a_pir_export_is_set_up_as_data():
    """paddle.tensorrt's Input / TensorRTConfig arguments from the inference keys; what
    PIR-TRT cannot do (calibrate; INT8 without the model's scales) refused in one line."""
    fp16 = build_config(
        {"inference.trt_precision": "FP16", "inference.trt_workspace_size": 2048}
    ).inference
    assert pir_tensorrt.conversion_settings(fp16, (3, 224, 224), 32, quantized=False) == {
        "input": {
            "name": feeds.IMAGE,
            "min_input_shape": [1, 3, 224, 224],
            "optim_input_shape": [32, 3, 224, 224],
            "max_input_shape": [32, 3, 224, 224],
        },
        "precision_mode": "FP16",
        "workspace_size": 2048 << 20,
        "min_subgraph_size": 3,
    }
    assert [call.method for call in pir_tensorrt.predictor_calls(fp16)] == [
        "switch_ir_optim",
        "enable_use_gpu",
    ]
    int8 = build_config({"inference.trt_precision": "INT8"}).inference
    settings = pir_tensorrt.conversion_settings(int8, (3, 224, 224), 8, quantized=True)
    assert settings["precision_mode"] == "INT8"
    with pytest.raises(ConfigError, match="INT8 on a PIR export needs the model's own scales"):
        pir_tensorrt.conversion_settings(int8, (3, 224, 224), 8, quantized=False)
    calibrated = build_config(
        {"inference.trt_precision": "INT8", "inference.trt_use_calib_mode": True}
    ).inference
    with pytest.raises(ConfigError, match=r"PIR export \(inference.json\) has no calibrator"):
        pir_tensorrt.conversion_settings(calibrated, (3, 224, 224), 8, quantized=True)


@pir_only
def test_paddle_trt_conversion_without_paddle_tensorrt_is_one_line(tmp_path):
    """The conversion runs in its own process; where Paddle has no paddle.tensorrt (every
    CPU wheel) it ends in one line, and no tensorrt/ folder is left."""
    toy_pir_export(tmp_path)
    inf = build_config({}).inference
    with pytest.raises(UserError) as refused:
        pir_tensorrt.converted_model(str(tmp_path), inf, (3, 8, 8), 4, quantized=False)
    assert str(refused.value) == (
        f"{tmp_path}: the TensorRT conversion failed (error: Paddle-TRT on a PIR export "
        "needs Paddle 3 built with TensorRT (paddlepaddle-gpu 3.x): this Paddle has no "
        "paddle.tensorrt)"
    )
    assert not os.path.exists(tmp_path / exported.TENSORRT_DIR)


@pir_only
def test_a_pir_qat_model_exports_and_serves_at_the_accuracy_training_measured(
    trained, fmnist_root, tmp_path, capsys
):
    """QAT on PIR from fp32 weights (the legacy IR's: fresh quantizers), exported with
    its fake-quantize ops and trained scales: Paddle Inference 3.3.1 runs it (its
    constant folding, which fails on those ops, left out) at the top-1 training
    measured; oneDNN int8, which has no PIR passes, refused."""
    model_dir = str(tmp_path / "model")
    fp32 = os.path.join(
        run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), "model.pdparams"
    )
    config = small_config(
        fmnist_root,
        tmp_path / "out",
        **{
            "run.ir": "pir",
            "run.epochs": 1,
            "qat.enabled": True,
            "run.from_pretrained_params": fp32,
            "inference.model_dir": model_dir,
        },
    )
    metrics = train.run(config, report_stream=open(os.devnull, "w"))
    assert exported.read_info(model_dir)["quantization"] == dict(
        qat.PIR_QAT_RECORD, ops=["conv2d", "matmul"]
    )
    argv = ["--inference-dir", model_dir, "--mode", "accuracy", "--image-root", fmnist_root]
    capsys.readouterr()
    assert inference.main(argv) == 0
    assert f"top1 {metrics['val.top1']:.5g}" in capsys.readouterr().out
    assert inference.main([*argv, "--cpu-precision", "int8"]) == 2
    assert "Paddle 3 has no oneDNN int8 passes for PIR programs" in capsys.readouterr().err


@pir_rehearsal
@pir_only
def test_pir_prunes_a_dense_model_and_retrains_it_with_qat_to_a_2to4_export(
    trained, fmnist_root, tmp_path
):
    """Prune-then-retrain and --asp --qat on PIR, as NVIDIA's workflow orders them: the
    dense legacy model pruned 2:4 by the toolkit and fine-tuned, then trained with
    paddle.quantization's fake quantizers from that 2:4 model, and exported with its
    weights 2:4 (the checker's verdict on inference.json)."""
    model_dir = str(tmp_path / "model")
    common = {"run.ir": "pir", "run.epochs": 1, "asp.enabled": True}
    pruned = small_config(
        fmnist_root,
        tmp_path / "pruned",
        **common,
        **{
            "asp.prune_model": True,
            "lr.base": 0.08,  # a fine-tune, at a tenth of the training LR
            "run.from_pretrained_params": os.path.join(
                run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), "model.pdparams"
            ),
        },
    )
    metrics = train.run(pruned, report_stream=open(os.devnull, "w"))
    assert metrics["val.top1"] > 0.2  # twice chance (10 classes): the 2:4 model learns
    config = small_config(
        fmnist_root,
        tmp_path / "qat",
        **common,
        **{
            "qat.enabled": True,
            "run.from_pretrained_params": os.path.join(
                run_folder.checkpoint_dir(str(tmp_path / "pruned"), "resnet18", 1), "model.pdparams"
            ),
            "inference.model_dir": model_dir,
            "inference.onnx": True,
        },
    )
    metrics = train.run(config, report_stream=open(os.devnull, "w"))
    assert exported.read_info(model_dir)["quantization"] == dict(
        qat.PIR_QAT_RECORD, ops=["conv2d", "matmul"]
    )
    tables, sparsity = sparsity_report.tables(model_dir)
    marked = set(sparsity["weights"])
    assert sparsity["pattern"] == "2:4" and len(marked) == 19  # marked sparse in model.json
    assert sparsity_report.report(model_dir) == []  # ... and each one 2:4, in model.onnx too
    onnx_rows = tables[os.path.join(model_dir, exported.ONNX_FILE)]
    assert sum(row["precision"].startswith("int8") for row in onnx_rows) == 21
    assert all(row["holds_pattern"] for row in onnx_rows if row["param"] in marked)
    served_in_int8(model_dir, fmnist_root, metrics["val.top1"])
    saved = ckpt.read_checkpoint(run_folder.checkpoint_dir(str(tmp_path / "qat"), "resnet18", 1))[1]
    assert len(pattern.sparse_parameters(saved)) == 19


def served_in_int8(model_dir, image_root, top1):
    """The int8 model.onnx of a PIR export served by OpenVINO with every convolution and
    the classifier in int8, and by ONNX Runtime, each within 5 of the 130 images of
    ``top1`` (5: the rehearsal's PIR-trained model is near chance, its margins thin);
    Paddle's oneDNN int8, which PIR programs do not get, refused naming them."""
    argv = ["--inference-dir", model_dir, "--mode", "accuracy", "--image-root", image_root]
    for backend, precision in (("openvino", "int8"), ("onnxruntime", "fp32")):
        result = run_python(
            "inference.py", *argv, "--backend", backend, "--cpu-precision", precision
        )
        assert result.returncode == 0, result.stderr[-2000:]
        if backend == "openvino":
            assert "21 int8 convolution/matmul layers" in result.stdout, result.stdout
        served = float(result.stdout.split(" top1 ")[1].split()[0])
        assert abs(served - top1) <= 5 / 130 + 1e-9, (backend, served, top1)
    refused = run_python("inference.py", *argv, "--cpu-precision", "int8")
    assert refused.returncode == 2
    assert "its int8 runs from model.onnx with --backend openvino" in refused.stderr


@pir_rehearsal
@pir_only
def test_pir_post_training_quantization_writes_an_int8_model_onnx(trained, fmnist_root, tmp_path):
    """--ptq-algo on PIR, without the legacy IR: the toolkit calibrates the 21 inputs of
    the convolutions and the classifier and both inputs of the residual adds over the PIR
    export, keeps its Paddle program fp32
    (what Paddle Inference serves at the fp32 top-1) and writes an int8 model.onnx that
    OpenVINO runs in int8 near that top-1; Paddle's legacy-only algorithms refused in one
    line."""
    model_dir = str(tmp_path / "model")
    values = {
        "run.ir": "pir",
        "run.from_checkpoint": run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3),
        "inference.model_dir": model_dir,
        "inference.onnx": True,
        "inference.ptq_algo": "hist",
        "inference.calibration_images": 64,
    }
    exporting.export(small_config(fmnist_root, tmp_path / "out", **values))
    quantization = exported.read_info(model_dir)["quantization"]
    assert quantization["ir"] == "pir" and quantization["calibration_images"] == 64
    assert len(quantization["input_ranges"]) == 21
    assert all(value > 0 for value in quantization["input_ranges"].values())
    # both inputs of ResNet-18's 8 residual adds too, as NNCF quantizes them
    add_ranges = quantization["add_input_ranges"]
    assert len(add_ranges) == 8 and all(r > 0 for pair in add_ranges for r in pair)
    graph = onnx_int8._Graph(onnx.load(os.path.join(model_dir, "model.onnx")).graph)
    adds = onnx_int8.residual_adds(graph)
    assert len(adds) == 8
    # the stem's max pool behind its quantization, so that it runs on int8 (as NNCF's
    # does): its output, the first block's shortcut, is on the int8 grid as it is
    (pool,) = [node for node in graph.graph.node if node.op_type == "MaxPool"]
    assert graph.producers[pool.input[0]].op_type == "DequantizeLinear"
    assert {reader.op_type for reader in graph.consumers[pool.output[0]]} == {"Conv", "Add"}
    assert {graph.producers[name].op_type for add in adds for name in add.input} == {
        "DequantizeLinear",
        "MaxPool",
    }
    argv = ["--inference-dir", model_dir, "--mode", "accuracy", "--image-root", fmnist_root]
    fp32 = run_python("inference.py", *argv, "--backend", "cpu")
    assert fp32.returncode == 0, fp32.stderr[-2000:]
    served_in_int8(model_dir, fmnist_root, float(fp32.stdout.split(" top1 ")[1].split()[0]))
    with pytest.raises(ConfigError, match="--ptq-algo KL on PIR: the toolkit calibrates"):
        exporting.export(
            small_config(
                fmnist_root, tmp_path / "out", **dict(values, **{"inference.ptq_algo": "KL"})
            )
        )


@pir_only
@pytest.mark.skipif(devices.gpu_available(), reason="the CPU's choices")
@pytest.mark.parametrize(
    "values, expected",
    [
        ({"data.crop_size": 224}, ("pir", None)),
        ({"data.crop_size": 96, "model.arch": "resnet50"}, ("pir", None)),
        ({"data.crop_size": 32}, ("pir", None)),  # on oneDNN convolutions, as the legacy IR
        ({"data.crop_size": 32, "run.cpu_onednn": False}, ("pir", None)),
        ({"data.crop_size": 32, "amp.enabled": True, "amp.dtype": "bfloat16"}, ("pir", None)),
        ({"data.crop_size": 224, "run.sync_bn": True}, ("legacy", "--sync-bn is built on")),
        ({"data.crop_size": 224, "amp.enabled": True}, ("legacy", "--amp with float16 on PIR")),
        ({"data.crop_size": 32, "run.ir": "pir"}, ("pir", None)),
        ({"data.crop_size": 224, "run.ir": "legacy"}, ("legacy", None)),
    ],
)
def test_paddle_3_chooses_pir_unless_the_legacy_ir_is_faster_or_pir_lacks_the_option(
    values, expected
):
    if bootstrap.pir_only():
        pytest.skip("the rehearsal chooses PIR always (its own test)")
    name, why = ir.chosen(build_config(values))
    assert name == expected[0]
    assert (why is None) if expected[1] is None else why.startswith(expected[1]), why
    note = ir.legacy_note(build_config(values))
    assert (note is None) == (why is None)


@pir_rehearsal
@pir_only
def test_the_pir_only_rehearsal_runs_on_pir_and_refuses_the_legacy_ir_in_one_line(
    fmnist_root, tmp_path
):
    """PADDLE_RESNET_PIR_ONLY=1, a Paddle without the legacy IR: the demo's settings run
    on PIR, and what needs the legacy IR is refused in one line naming the switch."""
    if not bootstrap.pir_only():
        pytest.skip("the rehearsal's own: scripts/test.sh runs it with PADDLE_RESNET_PIR_ONLY=1")
    assert ir.chosen(build_config({"data.crop_size": 32})) == ("pir", None)
    result = run_python(
        "train.py", "--config", "resnet18_demo", "--image-root", fmnist_root,
        "--output-dir", str(tmp_path / "out"), "--ir", "legacy",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: --ir legacy: PADDLE_RESNET_PIR_ONLY=1 makes the legacy IR unavailable"
    ]
    with pytest.raises(ConfigError, match="--sync-bn is built on the legacy IR only, unavailable"):
        ir.check(build_config({"run.sync_bn": True}))
    with pytest.raises(UserError, match="needs Paddle's legacy IR, which PADDLE_RESNET_PIR_ONLY"):
        with paddle_internals.static_ir(False):
            pass
    legacy_export = tmp_path / "legacy"
    legacy_export.mkdir()
    (legacy_export / exported.MODEL_FILE).write_bytes(b"")
    with pytest.raises(UserError, match="exported from the legacy IR .inference.pdmodel., which"):
        exported.model_paths(str(legacy_export))


@pir_only
@pytest.mark.skipif(devices.gpu_available(), reason="the CPU's choice")
def test_a_plain_run_at_imagenet_crops_is_on_pir_and_the_report_says_so(
    fmnist_root, tmp_path, monkeypatch
):
    """train.py without --ir on Paddle 3 at ImageNet's 224-pixel crops (one benchmark step:
    the choice is made before any): PIR (measured as fast as the legacy IR there), said on
    the console and in the report; the demo's 32-pixel crops on PIR too (its oneDNN
    convolutions, faster than the legacy IR's), but for a multi-process CPU job (at any
    crop), which stays on the legacy IR with one line saying why."""
    if bootstrap.pir_only():
        pytest.skip("the rehearsal chooses PIR always (its own test)")
    out = tmp_path / "out"
    result = run_python(
        "train.py", "--model-arch-name", "resnet18", "--num-of-class", "10",
        "--image-root", fmnist_root, "--output-dir", str(out), "--crop-size", "224",
        "--resize-short", "256", "--batch-size", "4",
        "--benchmark", "--benchmark-steps", "1", "--benchmark-warmup-steps", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rank 0/1, CPU, PIR" in result.stdout, result.stdout
    assert "on the legacy IR" not in result.stdout
    parameters = next(r for r in read_report(str(out / "report.json")) if r["step"] == "PARAMETER")
    assert parameters["data"]["ir"] == {"name": "pir", "why": None}
    assert parameters["data"]["run"]["ir"] is None  # unset: chosen
    tcmalloc = bootstrap.tcmalloc() is not None  # preloaded where installed
    assert parameters["data"]["allocator"] == ("tcmalloc" if tcmalloc else "system")
    assert ir.legacy_note(build_config({"data.crop_size": 32})) is None
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    note = ir.legacy_note(build_config({"data.crop_size": 32}))
    assert note.startswith("on the legacy IR: a multi-process CPU job stays on the legacy IR")
    assert ir.legacy_note(build_config({"data.crop_size": 224})) == note
