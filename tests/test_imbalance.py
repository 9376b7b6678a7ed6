"""Long-tailed training data: the logit-adjusted loss (balanced softmax at tau 1), deferred
class weights and class-balanced sampling each change what they should, on each IR this
Paddle has; a run using them stopped mid-epoch and resumed ends bit-identical."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import paddle
import pytest

from conftest import (
    PADDLE3,
    ROOT,
    assert_same_state,
    once,
    pir_rehearsal,
    run_python,
    train_args,
)
from paddle_resnet.core import feeds
from paddle_resnet.core.config import build_config, run_differences
from paddle_resnet.core.errors import ConfigError, DataError
from paddle_resnet.core.report import read_report
from paddle_resnet.data.dali import DataSplit, class_balanced_order, make_loader, train_indices
from paddle_resnet.data.folder import ImageList, scan_split
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import class_weights, ir, programs

IRS = ("legacy", "pir") if PADDLE3 else ("legacy",)
COUNTS = (40, 5, 10, 2)  # images per class of the small split the tests count


def split_of(counts):
    labels = tuple(label for label, count in enumerate(counts) for _ in range(count))
    names = tuple(f"c{label}" for label in range(len(counts)))
    return DataSplit.of_images("train", ImageList(("x.jpg",) * len(labels), labels, names))


def head_loss(ir_name, logits, labels, offsets, smoothing=0.0, weights=None):
    """(loss, batch top-1) of the train head on given logits with fed logit offsets (and
    class weights), built and run on ``ir_name``."""
    with ir.selected(build_config({"run.ir": ir_name})):
        paddle.enable_static()
        main, startup = paddle.static.Program(), paddle.static.Program()
        classes = logits.shape[1]
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("logits", [None, classes], "float32")
            y = paddle.static.data(feeds.LABEL, [None, 1], "int64")
            o = paddle.static.data(feeds.LOGIT_OFFSETS, [classes], "float32")
            w = None if weights is None else paddle.static.data(feeds.CLASS_WEIGHTS, [classes])
            fetches, _ = programs._train_head(x, y, classes, smoothing, None, w, o)
        feed = {"logits": logits, feeds.LABEL: labels, feeds.LOGIT_OFFSETS: offsets}
        if weights is not None:
            feed[feeds.CLASS_WEIGHTS] = weights
        exe = paddle.static.Executor(paddle.CPUPlace())
        loss, top1 = exe.run(main, feed=feed, fetch_list=[fetches["loss"], fetches["top1"]])
        return float(loss), float(top1)


def log_softmax(scores):
    shifted = scores - scores.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("ir_name", IRS)
def test_logit_adjusted_loss_is_the_hand_computation(ir_name):
    """tau x log prior added to the logits in the loss only: at tau 1 the loss is balanced
    softmax's -log(n_y e^z_y / sum_j n_j e^z_j) (Ren et al. 2020), with label smoothing the
    smoothed target against the adjusted scores; the batch top-1 is the raw logits'."""
    counts = np.array(COUNTS, "float64")
    offsets = class_weights.logit_offsets(1.0, split_of(COUNTS))
    np.testing.assert_allclose(offsets, np.log(counts / counts.sum()), rtol=1e-6)
    # raw logits that favour the rare class 3 for every image: the raw top-1 is 1/4,
    # the adjusted scores' argmax would be class 0 for all
    logits = np.array([[0.0, 0.1, 0.2, 1.5]] * 4, "float32")
    labels = np.array([[0], [1], [2], [3]], "int64")

    loss, top1 = head_loss(ir_name, logits, labels, offsets)
    balanced_softmax = -np.log(
        counts[labels.ravel()]
        * np.exp(logits[np.arange(4), labels.ravel()])
        / (counts * np.exp(logits)).sum(axis=1)
    )
    assert loss == pytest.approx(balanced_softmax.mean(), rel=1e-5)
    assert top1 == 0.25  # only the image of class 3: the raw logits

    tau, smoothing = 0.5, 0.1
    weights = np.array([0.5, 2.0, 1.0, 4.0], "float32")
    offsets = class_weights.logit_offsets(tau, split_of(COUNTS))
    loss, _ = head_loss(ir_name, logits, labels, offsets, smoothing, weights)
    target = np.eye(4)[labels.ravel()] * (1 - smoothing) + smoothing / 4
    per_image = -(target * log_softmax(logits + tau * np.log(counts / counts.sum()))).sum(axis=1)
    image_weights = weights[labels.ravel()]
    expected = (per_image * image_weights).sum() / image_weights.sum()
    assert loss == pytest.approx(expected, rel=1e-5)
    plain = -(target * log_softmax(logits)).sum(axis=1)
    assert abs(expected - (plain * image_weights).sum() / image_weights.sum()) > 0.1


def test_deferred_weights_switch_at_the_epoch():
    """--class-weights-from-epoch 3: weights of 1 (the plain loss) in epochs 1 and 2, the
    balanced weights from epoch 3 on; the offsets of --logit-adjustment in every epoch."""
    values = {"loss.class_weights": "balanced", "run.epochs": 4, "lr.warmup_epochs": 0}
    config = build_config(dict(values, **{"loss.class_weights_from_epoch": 3}))
    balance = class_weights.for_run(config, split_of(COUNTS))
    balanced = class_weights.resolve("balanced", split_of(COUNTS))
    assert balanced.max() / balanced.min() == 20
    for epoch in (1, 2):
        assert set(balance.feeds(epoch)) == {feeds.CLASS_WEIGHTS}
        np.testing.assert_array_equal(balance.feeds(epoch)[feeds.CLASS_WEIGHTS], np.ones(4))
    for epoch in (3, 4):
        np.testing.assert_array_equal(balance.feeds(epoch)[feeds.CLASS_WEIGHTS], balanced)
    assert "from epoch 3 (the plain loss before it)" in balance.describe(config.loss, "abcd")[0]
    from_start = class_weights.for_run(build_config(values), split_of(COUNTS))
    np.testing.assert_array_equal(from_start.feeds(1)[feeds.CLASS_WEIGHTS], balanced)
    adjusted = class_weights.for_run(build_config({"loss.logit_adjustment": 1.0}), split_of(COUNTS))
    assert set(adjusted.feeds(1)) == {feeds.LOGIT_OFFSETS}
    assert class_weights.for_run(build_config({}), split_of(COUNTS)) is None


def test_class_balanced_draws_are_even_disjoint_across_ranks_and_reproducible():
    """Each epoch draws every class equally often from one order per (seed, epoch): two
    ranks' shares are disjoint slices of it, a common class's images come at most once,
    the same epoch draws the same again (a resumed run), the next epoch another order."""
    labels = np.repeat(np.arange(len(COUNTS)), COUNTS)  # 57 images, 40:2
    order = class_balanced_order(labels, np.random.RandomState(7 + 2))
    assert sorted(np.bincount(labels[order]).tolist()) == [14, 14, 14, 15]
    shares = [
        train_indices(len(labels), 4, rank, 2, seed=7, epoch=2, labels=labels) for rank in (0, 1)
    ]
    assert [len(share) for share in shares] == [28, 28]  # 7 steps of 4 each
    np.testing.assert_array_equal(shares[0], order[:28])
    np.testing.assert_array_equal(shares[1], order[28:56])
    for share in shares:  # each rank's own share is near-uniform too
        assert np.bincount(labels[share], minlength=4).min() >= 4
    drawn = np.concatenate(shares)
    common = drawn[labels[drawn] == 0]
    assert len(common) >= 13 and len(set(common.tolist())) == len(common)
    again = train_indices(len(labels), 4, 1, 2, seed=7, epoch=2, labels=labels)
    np.testing.assert_array_equal(again, shares[1])
    later = train_indices(len(labels), 4, 1, 2, seed=7, epoch=3, labels=labels)
    assert not np.array_equal(later, shares[1])
    # the shuffle without labels is the permutation it always was (resumes of older runs)
    np.testing.assert_array_equal(
        train_indices(len(labels), 4, 0, 2, seed=7, epoch=2),
        np.random.RandomState(9).permutation(len(labels))[:28],
    )


def test_class_balanced_loader_reads_the_draws_again_for_the_same_epoch(fmnist_root):
    """Rank 1 of 2's DALI loader under --sampling class-balanced, on real images chosen
    unbalanced (16, 2, 4 and 1 of four classes): its labels are the draw's, near-uniform,
    and the same epoch's loader (a resumed run's) yields the same images again."""
    tree = scan_split(fmnist_root, "train")
    wanted = {0: 16, 1: 2, 2: 4, 3: 1}
    chosen = [
        i
        for i, label in enumerate(tree.labels)
        if label in wanted and tree.labels[: i + 1].count(label) <= wanted[label]
    ]
    images = ImageList(
        tuple(tree.files[i] for i in chosen), tuple(tree.labels[i] for i in chosen), tree.classes
    )
    config = build_config(
        {"data.sampling": "class-balanced", "data.batch_size": 4, "data.crop_size": 28}
    ).data

    def rank_1_labels(epoch):
        loader = make_loader(
            DataSplit.of_images("train", images), config, "NCHW", True, 1, 2, epoch
        )
        batches = list(loader)
        return np.concatenate([b[feeds.LABEL] for b in batches]).ravel(), batches

    labels, batches = rank_1_labels(3)
    drawn = train_indices(len(images), 4, 1, 2, config.seed, 3, images.labels)
    assert labels.tolist() == [images.labels[i] for i in drawn] and len(labels) == 8
    assert np.bincount(labels, minlength=4).min() >= 1  # every class, the lone image too
    again_labels, again = rank_1_labels(3)
    np.testing.assert_array_equal(again_labels, labels)
    for batch, same in zip(batches, again):
        np.testing.assert_array_equal(batch[feeds.IMAGE], same[feeds.IMAGE])


def test_settings_that_cannot_work_are_one_line():
    cases = [
        ({"loss.class_weights_from_epoch": 2}, "--class-weights-from-epoch needs --class-weights"),
        (
            {
                "loss.class_weights": "balanced",
                "loss.class_weights_from_epoch": 5,
                "run.epochs": 4,
                "lr.warmup_epochs": 0,
            },
            "must be at most run.epochs (4), got 5: the weights would never apply",
        ),
        (
            {"data.sampling": "class-balanced", "loss.logit_adjustment": 1.0},
            "corrects the imbalance twice",
        ),
        ({"data.sampling": "class-balanced", "loss.class_weights": "x.json"}, "twice"),
        ({"loss.logit_adjustment": -1.0}, "--logit-adjustment) must be at least 0"),
    ]
    for values, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            build_config(values)
    records = DataSplit("train", ("a", "b"), 100)  # a record file: no image list
    for values, needed_by in (
        ({"data.sampling": "class-balanced"}, "--sampling class-balanced"),
        ({"loss.logit_adjustment": 1.0}, "--logit-adjustment"),
    ):
        with pytest.raises(DataError, match=f"^{needed_by} counts the images of each class"):
            class_weights.for_run(build_config(values), records)
    with pytest.raises(DataError, match="no training image of class 'c1'"):
        class_weights.logit_offsets(1.0, split_of((3, 0, 2)))


def test_a_checkpoint_written_before_these_keys_resumes():
    """A run recorded before a key existed had its default: no difference to refuse."""
    saved = json.loads(json.dumps(build_config({}).to_dict()))  # as a checkpoint keeps it
    del saved["loss"]["logit_adjustment"], saved["data"]["sampling"]
    assert run_differences(saved, build_config({})) == []
    assert run_differences(saved, build_config({"data.sampling": "class-balanced"})) == [
        "data.sampling: 'shuffle' -> 'class-balanced'"
    ]


def stopped_in_epoch_1(command):
    """Run ``command``; SIGTERM once it logs step 2 of epoch 1. (exit code, output)."""
    job = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines, sent = [], False
    for line in job.stdout:
        lines.append(line)
        if "epoch 1 step 2:" in line and not sent:
            job.send_signal(signal.SIGTERM)
            sent = True
    return job.wait(timeout=300), "".join(lines)


@once
@pir_rehearsal
def test_stopped_mid_epoch_and_resumed_ends_bit_identical(fmnist_root, tmp_path):
    """Deferred class weights (from epoch 2) with the logit-adjusted loss, on a 4:1 cut of
    the small tree (5 steps an epoch): two epochs straight, and the same run stopped by
    SIGTERM in epoch 1 (before the weights start) then resumed from its mid-epoch
    checkpoint, end bit-identical. (Class-balanced draws follow (seed, epoch) as the
    shuffle does; the loader's test above reads them again.)"""
    tree = str(tmp_path / "4to1")
    made = run_python("scripts/data/imbalanced_tree.py", fmnist_root, tree, "--ratio", "4")
    assert made.returncode == 0, made.stderr
    flags = ("--class-weights", "balanced", "--class-weights-from-epoch", "2")
    flags += ("--logit-adjustment", "1", "--epochs", "2", "--run-scope", "train_only")
    common = (*flags, "--print-interval", "1")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    result = subprocess.run(
        [sys.executable, *train_args(tree, straight, *common)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "from epoch 2 (the plain loss before it)" in result.stdout
    records = read_report(str(straight / "report.json"))
    logged = {r["step"] for r in records if r["type"] == "PARAMETER"}
    assert {"CLASS_WEIGHTS", "LOGIT_OFFSETS"} <= logged
    code, output = stopped_in_epoch_1([sys.executable, "-u", *train_args(tree, stopped, *common)])
    assert code == 143, output[-2000:]
    saved = output.strip().splitlines()[-1].split("resume with: ")[1].split()[-1]
    assert os.path.basename(saved).startswith("1-step"), saved  # within epoch 1
    resumed = subprocess.run(
        [sys.executable, *train_args(tree, stopped, *common, "--from-checkpoint", saved)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_state(
        ckpt.read_checkpoint(str(stopped / "resnet18" / "2"))[1],
        ckpt.read_checkpoint(str(straight / "resnet18" / "2"))[1],
    )
