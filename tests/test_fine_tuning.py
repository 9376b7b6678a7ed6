"""Training on a user's own images: class weights in the loss, frozen stages and
per-stage learning rates, on each IR this Paddle has."""

import json
import os

import numpy as np
import paddle
import pytest

from conftest import PADDLE3, small_config
from paddle_resnet.commands import train
from paddle_resnet.core import feeds
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.core.report import read_report
from paddle_resnet.data.dali import DataSplit
from paddle_resnet.data.folder import ImageList
from paddle_resnet.models import model_entry
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import class_weights, finetune, ir, programs, run_folder
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX

IRS = ("legacy", "pir") if PADDLE3 else ("legacy",)


def weighted_loss(ir_name, logits, labels, weights, smoothing, mixup):
    """The train head's loss on given logits, built and run on ``ir_name``."""
    with ir.selected(build_config({"run.ir": ir_name})):
        paddle.enable_static()
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("logits", [None, logits.shape[1]], "float32")
            y = paddle.static.data(feeds.LABEL, [None, 1], "int64")
            w = paddle.static.data(feeds.CLASS_WEIGHTS, [logits.shape[1]], "float32")
            m = paddle.static.data(feeds.MIXUP_LAMBDA, [1], "float32")
            fetches, _ = programs._train_head(x, y, logits.shape[1], smoothing, m, w)
        exe = paddle.static.Executor(paddle.CPUPlace())
        feed = {
            "logits": logits,
            feeds.LABEL: labels,
            feeds.CLASS_WEIGHTS: weights,
            feeds.MIXUP_LAMBDA: np.array([mixup], "float32"),
        }
        return float(exe.run(main, feed=feed, fetch_list=[fetches["loss"]])[0])


@pytest.mark.parametrize("ir_name", IRS)
def test_class_weights_change_the_loss_as_specified(ir_name):
    """The weighted mean sum(w_i * loss_i) / sum(w_i), w_i the image's class weight,
    blended by MixUp; label smoothing changes the target only (computed by hand)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 4)).astype("float32")
    labels = np.array([[0], [1], [1], [2], [3], [3]], "int64")
    weights = np.array([1.0, 2.0, 0.5, 4.0], "float32")
    smoothing, mixup = 0.1, 0.3
    loss = weighted_loss(ir_name, logits, labels, weights, smoothing, mixup)

    target = np.eye(4)[labels.ravel()] * (1 - smoothing) + smoothing / 4
    target = mixup * target + (1 - mixup) * target[::-1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    per_image = -(target * log_probs).sum(axis=1)
    image_weights = weights[labels.ravel()]
    image_weights = mixup * image_weights + (1 - mixup) * image_weights[::-1]
    expected = (per_image * image_weights).sum() / image_weights.sum()
    assert loss == pytest.approx(expected, rel=1e-5)
    unweighted = weighted_loss(ir_name, logits, labels, np.ones(4, "float32"), smoothing, mixup)
    assert unweighted == pytest.approx(per_image.mean(), rel=1e-5) and unweighted != loss


def test_balanced_weights_are_inverse_class_frequency(tmp_path):
    labels = (0,) * 30 + (1,) * 3000 + (2,) * 300
    split = DataSplit.of_images(
        "train", ImageList(("x",) * len(labels), labels, ("rare", "common", "middle"))
    )
    weights = class_weights.resolve("balanced", split)
    np.testing.assert_allclose(weights, [3330 / 90, 3330 / 9000, 3330 / 900], rtol=1e-6)
    assert np.mean(weights[list(labels)]) == pytest.approx(1.0)  # averages 1 over the images
    table = tmp_path / "weights.csv"
    table.write_text("class,weight\nrare,5\ncommon,1\nmiddle,2\n")
    np.testing.assert_array_equal(class_weights.resolve(str(table), split), [5, 1, 2])
    (tmp_path / "w.json").write_text(json.dumps({"rare": 5, "common": 1}))
    with pytest.raises(ConfigError, match=r"missing \['middle'\]"):
        class_weights.resolve(str(tmp_path / "w.json"), split)
    (tmp_path / "w.json").write_text(json.dumps({"rare": 5, "common": 0, "middle": 1}))
    with pytest.raises(ConfigError, match="must be positive"):
        class_weights.resolve(str(tmp_path / "w.json"), split)


def test_stage_settings_must_fit_the_family():
    family = model_entry("resnet18").family
    with pytest.raises(ConfigError, match="at most 4 for resnet18"):
        finetune.check(build_config({"finetune.frozen_stages": 5}).finetune, family, "resnet18")
    with pytest.raises(ConfigError, match="takes 5 values for resnet18"):
        finetune.check(build_config({"finetune.lr_mult_list": "1,2"}).finetune, family, "resnet18")


def stage_parameters(config, stage):
    """(the parameter names of ``config``'s frozen stages, weights and batch-norm statistics;
    {name: trained} of the parameters of layer ``stage``)."""
    with ir.selected(config):
        built = programs.build_programs(config, steps_per_epoch=10, global_batch=16)
    family = model_entry(config.model.arch).family
    frozen = set(finetune.frozen_parameters(built.model, family, config.finetune))
    layer = dict(built.model.named_sublayers())[stage]
    return frozen, {p.name: not p.stop_gradient for p in layer.parameters()}


def fine_tune(trained, image_root, output_dir, ir_name, **values):
    """One epoch from the ``trained`` fixture's last weights with ``values`` set; (its
    config, the start state, the end state)."""
    start = os.path.join(run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), "model")
    config = small_config(
        image_root,
        output_dir,
        **{
            "run.ir": ir_name,
            "run.epochs": 1,
            "run.run_scope": "train_only",
            "run.from_pretrained_params": start,
            **values,
        },
    )
    train.run(config, report_stream=open(os.devnull, "w"))
    before = ckpt.read_state(start, optimizer=False)
    after = ckpt.read_checkpoint(run_folder.checkpoint_dir(str(output_dir), "resnet18", 1))[1]
    return config, before, after


@pytest.mark.parametrize("ir_name", IRS)
def test_frozen_stages_stay_bit_identical_and_resume_keeps_them(
    ir_name, trained, fmnist_root, tmp_path
):
    """Fine-tuning from a trained model with the stem and 2 stages frozen, the third
    stage's rate scaled to 0 and the fourth's to 2, with balanced class weights: the
    frozen weights and batch-norm statistics end bit-identical to the start; the third
    stage's weights too, but not its statistics; the rest moved. A resume with other
    stage settings is refused."""
    config, before, after = fine_tune(
        trained,
        fmnist_root,
        tmp_path,
        ir_name,
        **{
            "finetune.frozen_stages": 2,
            "finetune.lr_mult_list": "1,1,1,0,2",
            "loss.class_weights": "balanced",
        },
    )
    frozen, layer3 = stage_parameters(config, "layer3")
    # the stem's convolution and batch norm (weight, bias, mean, variance): 5; layer1's two
    # blocks of two of each: 20; layer2's too and its downsampling pair: 25
    assert len(frozen) == 5 + 20 + 25
    for name in frozen:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    # layer3 trains at rate 0: its weights stay, its batch norms' statistics move
    assert len(layer3) == 25
    for name, trained_ in layer3.items():
        assert np.array_equal(after[name], before[name]) == trained_, name
    moved = [
        name
        for name in before
        if name not in frozen and not np.array_equal(after[name], before[name])
    ]
    assert moved and all(name in after for name in before)
    weights = [r for r in read_report(config.report_file) if r["step"] == "CLASS_WEIGHTS"]
    assert len(weights) == 1 and set(weights[0]["data"]) == set(trained_classes(fmnist_root))
    resumed = build_config(
        dict(
            config.flat(),
            **{
                "run.epochs": 2,
                "run.from_checkpoint": "auto",
                "run.from_pretrained_params": None,
                "finetune.frozen_stages": 1,
            },
        )
    )
    with pytest.raises(UserError, match="finetune.frozen_stages: 2 -> 1"):
        train.run(resumed, report_stream=open(os.devnull, "w"))


def trained_classes(root):
    return sorted(os.listdir(os.path.join(root, "train")))


@pytest.mark.parametrize("ir_name", IRS)
def test_frozen_backbone_keeps_its_2to4_pruned_weights(ir_name, trained, fmnist_root, tmp_path):
    """--asp --prune-model with the whole backbone frozen (--frozen-stages 4: the
    classifier trains alone): every backbone weight ends as the pruned start, the
    loaded weight times its mask, bit for bit; batch-norm statistics as loaded."""
    config, before, after = fine_tune(
        trained,
        fmnist_root,
        tmp_path,
        ir_name,
        **{"finetune.frozen_stages": 4, "asp.enabled": True, "asp.prune_model": True},
    )
    frozen, _ = stage_parameters(config, "layer4")
    masked = [name for name in frozen if name + MASK_SUFFIX in after]
    assert len(masked) >= 19  # the 3x3 and downsampling convolutions of 4+ input channels
    for name in frozen:
        expected = before[name] * after[name + MASK_SUFFIX] if name in masked else before[name]
        np.testing.assert_array_equal(after[name], expected, err_msg=name)
    classifier = model_entry("resnet18").family.classifier
    assert not np.array_equal(after["linear_0.w_0"], before["linear_0.w_0"]), classifier
