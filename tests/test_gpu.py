"""The GPU counterparts of the tests that check behaviour without a GPU: they execute
what only a GPU can (fp16 kernels, nvJPEG decoding, TensorRT, NCCL). Written against
Paddle 2.6's and DALI 2.4's documented APIs; skipped, with the reason, on machines
without a usable NVIDIA GPU, which is every machine this project has had so far: none of
them has been executed."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest

from conftest import ROOT, flat, small_config, train_args
from paddle_resnet.core import devices, feeds, paddle_internals
from paddle_resnet.core.config import InferenceConfig, build_config
from paddle_resnet.data.dali import DataSplit, make_loader, open_split
from paddle_resnet.data.folder import scan_split
from paddle_resnet.deploy import dali_input, exported, predictor
from paddle_resnet.deploy import export as exporting
from paddle_resnet.training import programs as program
from paddle_resnet.training.loop import train_step

pytestmark = pytest.mark.gpu

NVIDIA_AMP = {"amp.enabled": True, "amp.scale_loss": 128.0, "amp.use_dynamic_loss_scaling": True}
TOY = os.path.join(ROOT, "tests", "ranks", "toy_reduction.py")
needs_tensorrt = pytest.mark.skipif(
    devices.tensorrt_version() is None, reason="needs TensorRT's libraries on the library path"
)


def as_array(value):
    return np.array(value) if isinstance(value, paddle.Tensor) else np.asarray(value)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_amp_training_steps_execute_and_lower_the_loss(fmnist_root, tmp_path, layout):
    config = small_config(
        fmnist_root, tmp_path, **NVIDIA_AMP, **{"model.data_layout": layout, "lr.base": 0.1}
    )
    programs = program.build_programs(config, steps_per_epoch=10, global_batch=16)
    place, device_id = devices.device()
    exe = paddle.static.Executor(place)
    exe.run(programs.startup)
    batch = next(
        iter(
            make_loader(
                open_split(config.data, "train"), config.data, layout, True, device_id=device_id
            )
        )
    )
    losses = [train_step(exe, programs, batch)["loss"] for _ in range(10)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses


def test_dali_gpu_decoding_matches_cpu_decoding(imagenet_root):
    """nvJPEG and libjpeg-turbo may round an IDCT differently: within 2 pixel levels on
    average, same labels."""
    config = build_config({"data.image_root": imagenet_root, "data.batch_size": 8})
    split = DataSplit.of_images("val", scan_split(imagenet_root, "val"))
    cpu = list(make_loader(split, config.data, "NCHW", False))
    gpu = list(make_loader(split, config.data, "NCHW", False, device_id=devices.device()[1]))
    assert len(cpu) == len(gpu) == 3
    for on_cpu, on_gpu in zip(cpu, gpu):
        np.testing.assert_array_equal(
            as_array(on_gpu[feeds.LABEL]).ravel(), on_cpu[feeds.LABEL].ravel()
        )
        difference = np.abs(as_array(on_gpu[feeds.IMAGE]) - on_cpu[feeds.IMAGE])
        assert difference.mean() < 2 / 255 / min(config.data.normalize_std)


@pytest.fixture(scope="module")
def model_dir(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_export")
    exporting.export(
        build_config(
            dict(
                flat(trained),
                **{
                    "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
                    "inference.model_dir": str(out / "model"),
                    "inference.export_log_path": str(out / "export.json"),
                },
            )
        )
    )
    return str(out / "model")


def classifier(model_dir, backend, **settings):
    info = exported.read_info(model_dir)
    calls = predictor.predictor_settings(
        InferenceConfig(**settings), backend, info["input_shape"], 16
    )
    return predictor.Classifier(model_dir, calls, info["input_shape"])


def validation_images(trained, model_dir):
    info = exported.read_info(model_dir)
    split = open_split(trained.data, "val")
    return np.concatenate(
        [b[feeds.IMAGE] for b in dali_input.validation_batches(split, trained.data, info)]
    )


@needs_tensorrt
def test_tensorrt_fp16_agrees_with_fp32(trained, model_dir):
    images = validation_images(trained, model_dir)[:16]
    fp32 = classifier(model_dir, "gpu")(images)
    fp16 = classifier(model_dir, "trt", trt_precision="FP16", trt_min_subgraph_size=1)(images)
    np.testing.assert_allclose(fp16, fp32, atol=1e-2)
    assert (fp16.argmax(1) == fp32.argmax(1)).mean() >= 15 / 16


@needs_tensorrt
def test_a_second_predictor_reuses_the_serialized_engine(trained, model_dir):
    images = validation_images(trained, model_dir)[:16]
    first = classifier(model_dir, "trt", trt_use_static=True)(images)
    cache = os.path.join(model_dir, "_opt_cache")  # Paddle's default beside the model
    engines = {name: os.path.getmtime(os.path.join(cache, name)) for name in os.listdir(cache)}
    assert engines
    second = classifier(model_dir, "trt", trt_use_static=True)(images)
    assert {
        name: os.path.getmtime(os.path.join(cache, name)) for name in os.listdir(cache)
    } == engines  # read, not rebuilt
    np.testing.assert_array_equal(second, first)


@pytest.mark.skipif(devices.gpu_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("amp", [False, True])
def test_two_nccl_ranks_equal_one_process(tmp_path, amp):
    flags = ["--amp"] if amp else []
    one = subprocess.run(
        [sys.executable, TOY, str(tmp_path / "one"), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "paddle.distributed.launch",
            "--gpus",
            "0,1",
            "--log_dir",
            str(tmp_path / "logs"),
            TOY,
            str(tmp_path / "two"),
            *flags,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    single, rank0, rank1 = (
        np.load(tmp_path / name) for name in ("one.0.npz", "two.0.npz", "two.1.npz")
    )
    assert "c_allreduce_sum" in list(rank0["ops"])
    for name in ("linear_0.w_0", "linear_0.b_0"):
        np.testing.assert_array_equal(rank0[name], rank1[name])
        np.testing.assert_allclose(rank0[name], single[name], rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(devices.gpu_count() < 2, reason="needs 2 GPUs")
def test_train_py_on_two_gpus_stops_and_continues_with_the_same_command(fmnist_root, tmp_path):
    """The path users run: train.py under paddle.distributed.launch on 2 GPUs (NCCL ring 0
    made by the startup program, after the ranks agreed on --from-checkpoint auto through
    the job's store), stopped by SIGTERM to the launcher in epoch 2 and started again with
    the same command: it resumes from the checkpoint at the step in flight and finishes."""
    out, logs = tmp_path / "job", tmp_path / "logs"
    command = [sys.executable, "-m", "paddle.distributed.launch", "--gpus", "0,1"]
    command += ["--log_dir", str(logs), *train_args(fmnist_root, out, "--epochs", "3")]
    command += ["--from-checkpoint", "auto", "--print-interval", "1"]
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    rank0 = logs / "workerlog.0"
    deadline = time.time() + 600
    while time.time() < deadline and job.poll() is None:
        if rank0.exists() and "epoch 2 step 2:" in rank0.read_text():
            break
        time.sleep(0.1)
    job.send_signal(signal.SIGTERM)
    stopped = job.wait(timeout=120)
    assert stopped == 15, rank0.read_text()[-3000:]  # the launcher after its ranks saved
    assert "stopped by SIGTERM in epoch 2" in rank0.read_text()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, (logs / "workerlog.0").read_text()[-3000:]
    log = (logs / "workerlog.0").read_text()
    assert re.search(r"--from-checkpoint auto: \S+/resnet18/2-step\d+, the newest", log), log
    assert os.path.exists(out / "resnet18" / "3" / "meta.json")


@pytest.mark.skipif(devices.gpu_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("mode", ["eval_only", "pir", "pir_bf16"])
def test_train_py_on_two_gpus_in_the_modes_whose_ring_nothing_made(fmnist_root, tmp_path, mode):
    """The modes whose first all-reduce found no NCCL ring before ring 0 was made for every
    mode (``paddle_internals.make_ring0``; tests/test_ring_order.py records the order on a
    stand-in): eval_only (no Fleet ``minimize``, no startup program with NCCL's set-up) and
    PIR (Fleet transpiles no PIR program), fp32 and bf16 AMP, each on 2 GPUs under the
    launcher, to the end: status 0, the evaluation summed over both ranks."""
    if mode.startswith("pir") and not paddle_internals.PADDLE3:
        pytest.skip("PIR needs Paddle 3 (its GPU wheels are on Paddle's own index)")
    out, logs = tmp_path / "job", tmp_path / "logs"
    launcher = [sys.executable, "-m", "paddle.distributed.launch", "--gpus", "0,1"]
    flags = {"eval_only": [], "pir": ["--ir", "pir"], "pir_bf16": ["--ir", "pir", "--amp"]}
    flags["pir_bf16"] += ["--amp-dtype", "bfloat16"]
    train = [*launcher, "--log_dir", str(logs), *train_args(fmnist_root, out, "--epochs", "1")]
    trained = subprocess.run(
        train + flags[mode], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert trained.returncode == 0, (logs / "workerlog.0").read_text()[-3000:]
    if mode == "eval_only":
        evaluated = subprocess.run(
            train + ["--run-scope", "eval_only", "--from-checkpoint", str(out / "resnet18")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert evaluated.returncode == 0, (logs / "workerlog.0").read_text()[-3000:]
    log = (logs / "workerlog.0").read_text()
    assert "[VAL] epoch " in log and "val.top1 " in log, log[-3000:]
