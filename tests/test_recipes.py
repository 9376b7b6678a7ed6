"""Every recipe of the source documents: loads, builds, trains a step, and says what the document says."""

import glob
import os
import re
import subprocess

import numpy as np
import paddle
import pytest

from conftest import ROOT, once
from paddle_resnet.core import feeds
from paddle_resnet.core.cli import parse
from paddle_resnet.core.config import ConfigError, DataConfig, list_recipes
from paddle_resnet.data.dali import make_loader, open_split
from paddle_resnet.training import programs as program
from paddle_resnet.training.optim import lr_at_step

RECIPES = {
    # name: (arch, momentum, nesterov, weight decay, LR per 256, schedule, epochs, mixup, smoothing)
    "resnet50_paddle_50e": ("resnet50", 0.875, False, 1 / 32768, 0.256, "cosine", 50, 0.0, 0.1),
    "resnet50_paddle_90e": ("resnet50", 0.875, False, 1 / 32768, 0.256, "cosine", 90, 0.0, 0.1),
    "resnet50_tf_90e": ("resnet50", 0.875, False, 1 / 32768, 0.256, "cosine", 90, 0.0, 0.1),
    "resnet50_tf_250e_mixup": ("resnet50", 0.875, False, 1 / 32768, 0.256, "cosine", 250, 0.2, 0.1),
    "resnet50_mxnet_90e": ("resnet50", 0.9, False, 1e-4, 0.1, "step", 90, 0.0, 0.0),
    "resnext101_32x4d_tf_90e": (
        "resnext101_32x4d",
        0.875,
        False,
        1 / 16384,
        0.256,
        "cosine",
        90,
        0.0,
        0.1,
    ),
    "resnext101_32x4d_tf_250e_mixup": (
        "resnext101_32x4d",
        0.875,
        False,
        1 / 16384,
        0.256,
        "cosine",
        250,
        0.2,
        0.1,
    ),
    "resnet50_he_90e": ("resnet50", 0.9, True, 1e-4, 0.1, "step", 90, 0.0, 0.1),
}


def recipe(name, *flags):
    return parse("train", ["--config", name, *flags])


def test_every_source_recipe_is_listed():
    assert set(RECIPES) <= set(list_recipes())


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_matches_its_document(name):
    arch, momentum, nesterov, wd, lr, schedule, epochs, mixup, smoothing = RECIPES[name]
    config = recipe(name)
    assert config.model.arch == arch and config.run.epochs == epochs
    assert config.optimizer.momentum == momentum and config.optimizer.nesterov == nesterov
    assert config.optimizer.weight_decay == pytest.approx(wd)
    assert not config.optimizer.bn_weight_decay
    assert (config.lr.base, config.lr.reference_batch, config.lr.schedule) == (lr, 256, schedule)
    assert config.lr.warmup_epochs == 5
    assert config.loss.mixup_alpha == mixup and config.loss.label_smoothing == smoothing
    steps, batch = 100, 1024
    peak = lr * batch / 256

    def lr_at_epoch(epoch):
        return lr_at_step(config.lr, int(epoch * steps), steps, epochs, batch)

    assert lr_at_epoch(0) == 0.0
    assert lr_at_epoch(2.5) == pytest.approx(peak / 2)
    assert lr_at_epoch(5) == pytest.approx(peak)  # warm-up end
    if schedule == "cosine":
        assert lr_at_epoch((5 + epochs) / 2) == pytest.approx(peak / 2)
        assert lr_at_epoch(epochs - 0.01) < peak * 1e-3  # cosine end
    else:
        for boundary, factor in ((30, 0.1), (60, 0.01), (80, 0.001)):
            assert lr_at_epoch(boundary - 0.01) == pytest.approx(peak * factor * 10)
            assert lr_at_epoch(boundary) == pytest.approx(peak * factor)
    if name == "resnet50_mxnet_90e":
        assert config.data.rand_crop_scale == (0.05, 1.0)
    if name == "resnet50_he_90e":
        assert config.model.zero_init_residual


# One recipe (ResNet-50, MixUp) on both versions; the others, which differ in values
# and depth only, on 2.6.2 alone.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=() if name == "resnet50_tf_250e_mixup" else once)
        for name in sorted(RECIPES)
    ],
)
def test_recipe_builds_and_trains_a_step_on_the_cpu(name):
    config = recipe(
        name, "--image-root", "x", "--num-of-class", "10", "--crop-size", "64", "--batch-size", "2"
    )
    arch, momentum, nesterov, wd, *_ = RECIPES[name]
    programs = program.build_programs(config, steps_per_epoch=10, global_batch=2)
    momentum_ops = [op for op in programs.train.global_block().ops if op.type == "momentum"]
    assert momentum_ops and all(op.attr("mu") == pytest.approx(momentum) for op in momentum_ops)
    assert {op.attr("use_nesterov") for op in momentum_ops} == {nesterov}
    decayed = [
        op.attr("regularization_coeff")
        for op in momentum_ops
        if op.attr("regularization_method") == "l2_decay"
    ]
    assert decayed and all(coeff == pytest.approx(wd) for coeff in decayed)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(programs.startup)
    rng = np.random.RandomState(0)
    feed = {
        feeds.IMAGE: rng.standard_normal((2, 3, 64, 64)).astype("float32"),
        feeds.LABEL: np.array([[1], [7]], dtype="int64"),
    }
    if config.loss.mixup_alpha:
        feed[feeds.MIXUP_LAMBDA] = np.array([0.7], dtype="float32")
    (loss,) = exe.run(programs.train, feed=feed, fetch_list=[programs.train_fetches["loss"]])
    assert np.isfinite(loss).all()


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(ConfigError, match="resnet50_paddle_90e"):
        recipe("resnet50_paddle_91e")


def _mixup_step(alpha, mixup_lambda):
    """Loss and soft targets of one step from fixed weights, with the given MixUp weight."""
    config = recipe(
        "resnet50_tf_250e_mixup",
        "--image-root",
        "x",
        "--model-arch-name",
        "resnet18",
        "--num-of-class",
        "10",
        "--crop-size",
        "32",
        "--mixup-alpha",
        str(alpha),
    )
    programs = program.build_programs(config, steps_per_epoch=10, global_batch=4)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(programs.startup)
    rng = np.random.RandomState(1)
    feed = {
        feeds.IMAGE: rng.standard_normal((4, 3, 32, 32)).astype("float32"),
        feeds.LABEL: np.array([[0], [3], [3], [9]], dtype="int64"),
    }
    if alpha:
        feed[feeds.MIXUP_LAMBDA] = np.array([mixup_lambda], dtype="float32")
    fetch = [programs.train_fetches["loss"], programs.soft_target]
    return exe.run(programs.train, feed=feed, fetch_list=fetch)


def test_mixup_with_weight_one_equals_no_mixup():
    plain_loss, plain_target = _mixup_step(0.0, None)
    mixed_loss, mixed_target = _mixup_step(0.2, 1.0)
    np.testing.assert_allclose(mixed_loss, plain_loss, rtol=1e-6)
    np.testing.assert_allclose(mixed_target, plain_target, atol=1e-7)


def test_mixup_targets_blend_the_reversed_batch_and_sum_to_one():
    _, target = _mixup_step(0.2, 0.3)
    np.testing.assert_allclose(target.sum(axis=1), 1.0, atol=1e-6)
    smooth = lambda c: np.eye(10)[c] * 0.9 + 0.01  # noqa: E731  label smoothing 0.1
    np.testing.assert_allclose(target[0], 0.3 * smooth(0) + 0.7 * smooth(9), atol=1e-6)


def test_color_jitter_changes_training_images_not_labels(fmnist_root):
    base = dict(
        image_root=fmnist_root,
        batch_size=16,
        crop_size=28,
        resize_short=28,
        num_threads=1,
        rand_crop_scale=(1.0, 1.0),
        rand_crop_ratio=(1.0, 1.0),
    )
    plain_cfg = DataConfig(**base)
    jitter_cfg = DataConfig(color_jitter=(0.4, 0.4, 0.4), **base)
    split = open_split(plain_cfg, "train")
    plain = next(iter(make_loader(split, plain_cfg, "NCHW", True)))
    jittered = next(iter(make_loader(split, jitter_cfg, "NCHW", True)))
    assert plain[feeds.IMAGE].shape == jittered[feeds.IMAGE].shape
    np.testing.assert_array_equal(plain["label"], jittered["label"])
    assert not np.allclose(plain["data"], jittered["data"], atol=0.05)


TRAINING_SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "scripts", "training", "train_*.sh")))


@pytest.mark.parametrize("script", TRAINING_SCRIPTS, ids=os.path.basename)
def test_each_launch_script_runs_what_its_name_says(script):
    """The command a recipe script would launch (DRY_RUN=1), its train.py flags parsed
    as train.py parses them: GPUs, architecture, epochs, precision and the
    sparsity / quantization / MixUp its name promises."""
    name = os.path.basename(script)[: -len(".sh")]
    wants_start = "QAT" in name or "ASP" in name  # these take a start checkpoint
    command = subprocess.run(
        ["bash", script] + (["/start/weights"] if wants_start else []),
        env=dict(os.environ, DRY_RUN="1"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert command[1:4] == ["-m", "paddle.distributed.launch", "--gpus"]
    gpus = int(re.search(r"_(\d+)GPU$", name).group(1))
    assert len(command[4].split(",")) == gpus
    assert command[5] == "train.py"
    config = parse("train", command[6:])
    assert config.model.arch == re.match(r"train_(resnet50|resnext101_32x4d)_", name).group(1)
    assert config.run.epochs == int(re.search(r"_(\d+)E_", name).group(1))
    amp = "_AMP_" in name
    assert config.amp.enabled is amp and ("_TF32_" in name) is (not amp)
    if amp:  # NVIDIA's AMP settings
        assert config.model.data_layout == "NHWC" and config.amp.scale_loss == 128.0
        assert config.amp.use_dynamic_loss_scaling
    assert config.asp.enabled is ("_ASP_" in name)
    assert config.qat.enabled is ("_QAT_" in name)
    assert (config.loss.mixup_alpha > 0) is ("mixup" in name)
    if config.qat.enabled:  # NVIDIA's QAT schedule
        assert config.lr.base == 5e-05
    assert config.data.format == ("recordio" if "_mxnet_" in name else "folder")
