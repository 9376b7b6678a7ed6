"""oneDNN training kernels (--cpu-onednn): the chosen ops and no others, the same learning
as the plain kernels, and resume still bit-identical."""
import os
import subprocess
import sys

import numpy as np

import program
import train
from conftest import ROOT, small_config
from paddle_resnet import checkpoint as ckpt
from paddle_resnet.onednn import TRAINING_OPS
from paddle_resnet.report import read_report


def test_only_the_chosen_ops_are_marked(fmnist_root, tmp_path):
    config = small_config(fmnist_root, tmp_path)                  # oneDNN is the default
    programs = program.build_programs(config, steps_per_epoch=10, global_batch=16)
    for built in (programs.train, programs.eval):
        ops = [op for op in built.global_block().ops if op.has_attr("use_mkldnn")]
        assert {op.type for op in ops if op.attr("use_mkldnn")} == (
            set(TRAINING_OPS) & {op.type for op in ops})
        assert all(op.attr("use_mkldnn") for op in ops if op.type in TRAINING_OPS)
    assert {"conv2d_grad", "relu_grad"} <= {op.type for op in programs.train.global_block().ops}
    plain = small_config(fmnist_root, tmp_path, **{"run.cpu_onednn": False})
    programs = program.build_programs(plain, steps_per_epoch=10, global_batch=16)
    assert not any(op.attr("use_mkldnn") for built in (programs.train, programs.eval)
                   for op in built.global_block().ops if op.has_attr("use_mkldnn"))
    exported = program.build_programs(config, training=False).eval   # what export saves
    assert not any(op.attr("use_mkldnn") for op in exported.global_block().ops
                   if op.has_attr("use_mkldnn"))


def test_onednn_learns_like_the_plain_kernels(fmnist_root, tmp_path):
    """Four epochs from the same initial weights on the same batches, plain and oneDNN.
    The kernels sum in another order, and 16-image batches make this small run's path
    sensitive to the last bits: mid-run epoch losses differed by up to 0.2 (measured,
    LR 0.2). What must hold is the learning: both fall by more than 0.5, and the last
    epoch's losses agree within 0.15 (measured: 1.971 plain, 1.963 oneDNN)."""
    finals = []
    for onednn in (False, True):
        config = small_config(fmnist_root, tmp_path / str(onednn), **{
            "run.epochs": 4, "lr.base": 0.2, "run.cpu_onednn": onednn,
            "run.run_scope": "train_only"})
        train.run(config, report_stream=open(os.devnull, "w"))
        epochs = [r["data"]["train.loss"] for r in read_report(config.report_file)
                  if r["type"] == "EPOCH"]
        assert epochs[-1] < epochs[0] - 0.5, (onednn, epochs)
        finals.append(epochs[-1])
    assert abs(finals[1] - finals[0]) < 0.15, finals


def test_resume_with_onednn_is_bit_identical(fmnist_root, tmp_path):
    common = [sys.executable, "train.py", "--model-arch-name", "resnet18", "--num-of-class", "10",
              "--image-root", fmnist_root, "--crop-size", "32", "--resize-short", "32",
              "--batch-size", "16", "--epochs", "2", "--warmup-epochs", "0.5", "--lr", "0.4",
              "--momentum", "0.9", "--run-scope", "train_only"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for extra in (["--output-dir", str(straight)],
                  ["--output-dir", str(resumed), "--from-checkpoint", str(straight / "resnet18" / "1")]):
        result = subprocess.run(common + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
    assert [r["step"] for r in read_report(str(resumed / "report.json"))
            if r["type"] == "EPOCH"] == [[2]]
    expected = ckpt.read_checkpoint(str(straight / "resnet18" / "2"))[1]
    actual = ckpt.read_checkpoint(str(resumed / "resnet18" / "2"))[1]
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
