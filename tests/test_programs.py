import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from paddle_resnet.commands import program as program_command
from paddle_resnet.core import feeds
from paddle_resnet.core.config import build_config
from paddle_resnet.training import programs as program
from paddle_resnet.training.optim import lr_at_step

# The GPU build of Paddle changes how these programs are built: also run there
# (scripts/test.sh's GPU-wheel track).
pytestmark = pytest.mark.gpu_wheel


def config(**values):
    base = {
        "model.arch": "resnet18",
        "model.num_classes": 10,
        "data.image_root": "x",
        "data.crop_size": 32,
        "data.resize_short": 32,
        "run.epochs": 10,
    }
    base.update(values)
    return build_config(base)


def op_types(prog):
    return [op.type for op in prog.global_block().ops]


def test_train_program_has_forward_loss_metrics_and_momentum():
    programs = program.build_programs(config(), steps_per_epoch=10, global_batch=256)
    types = op_types(programs.train)
    for expected in (
        "conv2d",
        "batch_norm",
        "relu",
        "pool2d",
        "matmul_v2",
        "one_hot_v2",
        "label_smooth",
        "softmax_with_cross_entropy",
        "accuracy",
        "conv2d_grad",
        "momentum",
    ):
        assert expected in types, expected
    assert set(programs.train_fetches) == {"loss", "top1", "top5"}


def test_weight_decay_only_on_conv_and_fc_weights():
    programs = program.build_programs(config(), steps_per_epoch=10, global_batch=256)
    shapes = {p.name: p.shape for p in programs.train.all_parameters() if p.trainable}
    decayed, plain, coefficients = [], [], []
    for op in programs.train.global_block().ops:
        if op.type == "momentum":
            name = op.input("Param")[0]
            if op.attr("regularization_method") == "l2_decay":
                decayed.append(name)
                coefficients.append(op.attr("regularization_coeff"))
            else:
                plain.append(name)
    assert decayed and plain
    assert coefficients == pytest.approx([1 / 32768] * len(decayed))
    assert all(len(shapes[name]) > 1 for name in decayed)  # conv and FC weights
    assert all(len(shapes[name]) == 1 for name in plain)  # BN scale/shift, FC bias
    assert sorted(decayed + plain) == sorted(shapes)


def test_bn_weight_decay_flag_decays_everything():
    programs = program.build_programs(
        config(**{"optimizer.bn_weight_decay": True}), steps_per_epoch=10, global_batch=256
    )
    methods = {
        op.attr("regularization_method")
        for op in programs.train.global_block().ops
        if op.type == "momentum"
    }
    assert methods == {"l2_decay"}


def test_nesterov_reaches_the_momentum_ops():
    programs = program.build_programs(
        config(**{"optimizer.nesterov": True}), steps_per_epoch=10, global_batch=256
    )
    momentum = [op for op in programs.train.global_block().ops if op.type == "momentum"]
    assert momentum and all(op.attr("use_nesterov") for op in momentum)


def test_eval_program_is_inference_only_and_shares_parameters():
    programs = program.build_programs(config(), steps_per_epoch=10, global_batch=256)
    types = op_types(programs.eval)
    assert "momentum" not in types and "conv2d_grad" not in types
    batch_norms = [op for op in programs.eval.global_block().ops if op.type == "batch_norm"]
    assert batch_norms and all(op.attr("is_test") for op in batch_norms)
    train_params = {p.name for p in programs.train.all_parameters()}
    assert {p.name for p in programs.eval.all_parameters()} <= train_params


def test_amp_adds_loss_scaling_through_fleet():
    programs = program.build_programs(
        config(
            **{"amp.enabled": True, "amp.scale_loss": 128.0, "amp.use_dynamic_loss_scaling": True}
        ),
        steps_per_epoch=10,
        global_batch=256,
    )
    types = op_types(programs.train)
    assert "check_finite_and_unscale" in types and "update_loss_scaling" in types


def test_nhwc_program_feeds_channels_last():
    programs = program.build_programs(
        config(**{"model.data_layout": "NHWC"}), steps_per_epoch=10, global_batch=256
    )
    data = programs.train.global_block().var(feeds.IMAGE)
    assert list(data.shape) == [-1, 32, 32, 3]
    convs = [op for op in programs.train.global_block().ops if op.type == "conv2d"]
    assert convs and all(op.attr("data_format") in ("NHWC", "AnyLayout") for op in convs)


def lr(step, **values):
    cfg = config(**values)
    return lr_at_step(cfg.lr, step, steps_per_epoch=100, epochs=cfg.run.epochs, global_batch=512)


def test_lr_warmup_then_cosine_scaled_to_global_batch():
    values = {"lr.base": 0.256, "lr.warmup_epochs": 2.0, "run.epochs": 10}
    peak = 0.256 * 512 / 256
    assert lr(0, **values) == 0.0
    assert lr(100, **values) == pytest.approx(peak / 2)
    assert lr(200, **values) == pytest.approx(peak)
    assert lr(600, **values) == pytest.approx(peak / 2)  # half-way through the cosine
    assert lr(999, **values) == pytest.approx(0.5 * peak * (1 + np.cos(np.pi * 799 / 800)))


def test_lr_step_schedule_drops_at_milestones():
    values = {
        "lr.base": 0.1,
        "lr.schedule": "step",
        "lr.warmup_epochs": 5.0,
        "run.epochs": 90,
        "lr.milestones": (30, 60, 80),
    }
    peak = 0.2
    assert lr(499, **values) == pytest.approx(peak * 499 / 500)
    assert lr(500, **values) == pytest.approx(peak)
    assert lr(2999, **values) == pytest.approx(peak)
    assert lr(3000, **values) == pytest.approx(peak * 0.1)
    assert lr(6000, **values) == pytest.approx(peak * 0.01)
    assert lr(8999, **values) == pytest.approx(peak * 0.001)


def test_scheduler_follows_lr_at_step_and_resumes():
    programs = program.build_programs(
        config(**{"lr.warmup_epochs": 1.0}), steps_per_epoch=100, global_batch=512
    )
    scheduler = programs.lr_scheduler
    values = []
    for _ in range(150):
        values.append(scheduler.get_lr())
        scheduler.step()
    expected = [lr(s, **{"lr.warmup_epochs": 1.0}) for s in range(150)]
    np.testing.assert_allclose(values, expected)
    scheduler.step(120)
    assert scheduler.get_lr() == pytest.approx(expected[120])


def test_program_py_describes_the_programs_without_running_them(tmp_path):
    """Root program.py: ResNet-50's published size (25,557,032 parameters, 4.1 G
    multiply-accumulates at 224 px) from the built eval program; the demo's train program
    with 2:4 sparsity shows ASP applied; the program text on request."""
    path = tmp_path / "programs.json"
    argv = ["--model-arch-name", "resnet50", "--run-scope", "eval_only", "--json", str(path)]
    assert program_command.main(argv) == 0
    described = json.loads(path.read_text())
    assert described["eval"]["parameters"] == 25_557_032
    assert 4.08e9 < described["eval"]["macs_per_image"] < 4.11e9
    assert described["eval"]["ops_by_type"]["conv2d"] == 53
    # as a user runs it: the root entry point, in its own process
    argv = ["--config", "resnet18_demo", "--asp", "--print-program", "eval"]
    shown = subprocess.run(
        [sys.executable, "program.py", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "strategies applied: ASP" in shown.stdout
    assert "conv2d" in shown.stdout.split("eval program:")[0]  # the text, printed first
