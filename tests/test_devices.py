"""Without a usable GPU, on either build of Paddle: GPU-only options are one-line
refusals naming the missing GPU, everything else runs on the CPU and says so; and the
preflight (``python -m paddle_resnet.commands.doctor``) reports what this machine can run.

The commands run as users run them, in subprocesses whose GPUs are hidden
(CUDA_VISIBLE_DEVICES empty), so they check the same thing on a GPU machine."""

import json
import os
import subprocess
import sys

import pytest
from paddle.base import core

from conftest import ROOT, once
from paddle_resnet.core import devices, paddle_internals

pytestmark = pytest.mark.gpu_wheel

NO_GPU = dict(os.environ, CUDA_VISIBLE_DEVICES="")


def run(*command):
    return subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=NO_GPU,
    )


def why():
    """What the commands say of the missing GPU, on this build."""
    if devices.cuda_build():
        return (
            f"this Paddle is the GPU build (paddlepaddle-gpu {devices.paddle.__version__}) "
            "but finds no usable GPU (CUDA_VISIBLE_DEVICES is empty)"
        )
    return f"this Paddle is the CPU build (paddlepaddle {devices.paddle.__version__})"


def one_line_error(result):
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    # Paddle 3.x prints a "Modified FLAGS detected" banner before anything else
    lines = [line for line in lines if "FLAGS" not in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "flags, option, purpose",
    [
        (["--amp"], "--amp", "fp16 kernels exist for CUDA only"),
        (["--amp", "--use-pure-fp16"], "--use-pure-fp16", "fp16 kernels exist for CUDA only"),
    ],
)
def test_fp16_training_is_refused_without_a_gpu(fmnist_root, tmp_path, flags, option, purpose):
    result = run(
        "train.py",
        "--image-root",
        fmnist_root,
        "--num-of-class",
        "10",
        "--output-dir",
        str(tmp_path),
        *flags,
    )
    assert one_line_error(result) == f"error: {option} needs an NVIDIA GPU ({purpose}); {why()}"
    assert not os.listdir(tmp_path)  # refused before anything was written


@once
def test_export_and_inference_run_on_the_cpu_and_gpu_backends_are_refused(trained, tmp_path):
    model_dir = tmp_path / "model"
    export = run(
        "export_model.py",
        "--model-arch-name",
        "resnet18",
        "--num-of-class",
        "10",
        "--crop-size",
        "32",
        "--resize-short",
        "32",
        "--from-checkpoint",
        os.path.join(trained.run.output_dir, "resnet18"),
        "--inference-dir",
        str(model_dir),
        "--export-log-path",
        str(tmp_path / "e.json"),
    )
    assert export.returncode == 0, export.stderr
    note = f"note: {why()}: running on the CPU"
    assert (export.stdout.splitlines()[0] == note) == devices.cuda_build(), export.stdout
    # --backend auto (the default) picks the CPU
    accuracy = run(
        "inference.py",
        "--inference-dir",
        str(model_dir),
        "--mode",
        "accuracy",
        "--image-root",
        trained.data.image_root,
        "--batch-size",
        "16",
        "--inference-log-path",
        str(tmp_path / "i.json"),
    )
    assert accuracy.returncode == 0, accuracy.stderr
    assert (accuracy.stdout.splitlines()[0] == note) == devices.cuda_build(), accuracy.stdout
    for backend in ("trt", "gpu"):
        refused = run(
            "inference.py",
            "--inference-dir",
            str(model_dir),
            "--backend",
            backend,
            "--inference-log-path",
            str(tmp_path / "i.json"),
        )
        line = one_line_error(refused)
        assert line.startswith(f"error: --backend {backend} needs an NVIDIA GPU"), line
        assert line.endswith(why()), line


def doctor(*args):
    return run("-m", "paddle_resnet.commands.doctor", *args)


def test_doctor_reports_the_build_and_what_it_means():
    result = doctor("--json")
    assert result.returncode == 0, result.stderr
    findings = {f["topic"]: f for f in json.loads(result.stdout)["findings"]}
    build = "GPU" if devices.cuda_build() else "CPU"
    assert findings["Paddle"]["found"] == f"{build} build, {devices.build_name()}"
    assert findings["GPUs"]["found"] == "none usable" and not findings["GPUs"]["met"]
    assert why() in findings["GPUs"]["meaning"]
    assert findings["bf16 (CPU)"]["met"] == core.supports_bfloat16()
    assert findings["int8 (CPU)"]["met"] == devices.cpu_has_int8_dot_products()
    if devices.cuda_build():
        # built against TensorRT, whose libraries are not on this machine's library path
        assert findings["TensorRT"]["found"].startswith("not loadable (Paddle built against")
        assert "--backend trt unavailable" in findings["TensorRT"]["meaning"]
        assert findings["CUDA / cuDNN"]["found"].startswith("built for CUDA ")
    else:
        assert "TensorRT" not in findings and "NCCL" not in findings
    assert "JPEG decoding on the CPU" in findings["DALI"]["meaning"]
    table = doctor()
    assert table.returncode == 0 and table.stdout.splitlines()[0].startswith("Paddle")


def test_doctor_exit_status_follows_the_requirements():
    missing = doctor("--require", "gpu,trt")
    assert missing.returncode == 1
    errors = missing.stderr.strip().splitlines()
    assert [line.split(":")[0] for line in errors] == ["error", "error"]
    assert errors[0].startswith("error: required gpu: ") and why() in errors[0]
    assert errors[1].startswith("error: required trt: ")
    cpu = doctor("--require", "bf16,int8")
    assert cpu.returncode == (
        0 if core.supports_bfloat16() and devices.cpu_has_int8_dot_products() else 1
    )
    unknown = doctor("--require", "gpu,tpu")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "error: --require: unknown requirement 'tpu'; known: gpu, "
        "trt, nccl, dali-gpu, bf16, int8, onnx, legacy, pir"
    )
    irs = doctor("--require", "legacy,pir")  # the IRs whose programs build here
    assert irs.returncode == (0 if paddle_internals.PADDLE3 else 1)
