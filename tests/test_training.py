"""End-to-end runs of train.py on real JPEGs: training, exact evaluation, checkpoints, resume."""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest
from visualdl import LogReader

from conftest import (
    ROOT,
    assert_same_state,
    flat,
    once,
    run_python,
    small_config,
    straight_and_resumed,
)
from paddle_resnet.commands import train
from paddle_resnet.core import metrics
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.core.report import Report, read_report
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import run_folder


def run(config):
    return train.run(config, report_stream=open(os.devnull, "w"))


def records(config, kind):
    return [r for r in read_report(config.report_file) if r["type"] == kind]


@pytest.mark.gpu_wheel
def test_training_lowers_the_loss(trained):
    epochs = records(trained, "EPOCH")
    assert [r["step"] for r in epochs] == [[1], [2], [3]]
    losses = [r["data"]["train.loss"] for r in epochs]
    assert losses[-1] < losses[0] - 0.2
    assert all(r["data"]["val.images"] == 130 for r in epochs)
    steps = records(trained, "LOG")
    for key in ("loss", "top1", "top5", "lr", "ips", "data_time", "compute_time", "batch_time"):
        assert key in steps[0]["data"]
    # each line's means are over every step since the line before (print_interval 5)
    per_step = [r for r in steps if r["step"][0] == 1]
    assert [r["step"][1] for r in per_step] == [5, 10]
    losses = [r["data"]["train.loss"] for r in epochs]
    means = [r["data"]["loss_mean"] for r in per_step]
    assert sum(means) / 2 == pytest.approx(losses[0])


def test_each_validation_reports_per_class_results(trained):
    """Every validation's CLASSES record: the confusion matrix of the 130 images (13 a
    class), its diagonal the VAL record's top-1, the balanced top-1 the mean of the
    classes' accuracies, the worst classes in order."""
    validations, per_class = records(trained, "VAL"), records(trained, "CLASSES")
    assert [r["step"] for r in per_class] == [r["step"] for r in validations] == [[1], [2], [3]]
    for val, result in zip(validations, per_class):
        val, result = val["data"], result["data"]
        confusion = np.array(result["confusion"])
        assert confusion.shape == (10, 10) and (confusion.sum(axis=1) == 13).all()
        assert np.trace(confusion) / 130 == pytest.approx(val["val.top1"])
        accuracy = np.diag(confusion) / 13
        assert result["accuracy"] == pytest.approx(list(accuracy))
        assert result["balanced_top1"] == pytest.approx(accuracy.mean())
        assert val["val.balanced_top1"] == result["balanced_top1"]
        assert [w[1] for w in result["worst"]] == sorted(accuracy)
        assert result["classes"] == sorted(result["classes"]) and len(result["classes"]) == 10


def test_per_class_results_of_many_classes_are_compact():
    """1,000 classes: each class's accuracy, the worst classes and the most confused
    pairs, not the matrix; the classes that lost most against another model."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(1000), 5)
    predicted = np.where(rng.random(5000) < 0.7, labels, rng.integers(0, 1000, 5000))
    predicted[labels == 7] = 3  # class 7 always taken for class 3
    confusion = metrics.confusion_counts(predicted[:, None], labels, 1000)
    classes = [f"n{i:04d}" for i in range(1000)]
    result = metrics.class_results(confusion, classes)
    assert "confusion" not in result and len(result["accuracy"]) == 1000
    assert len(result["worst"]) == metrics.WORST_CLASSES
    assert result["worst"][0] == ["n0007", 0.0, 5]
    assert result["confused"][0] == ["n0007", "n0003", 5]
    counts = [n for _, _, n in result["confused"]]
    assert counts == sorted(counts, reverse=True) and len(counts) == metrics.CONFUSED_PAIRS
    better = metrics.class_results(metrics.confusion_counts(labels[:, None], labels, 1000), classes)
    changes = metrics.class_changes(better, result)
    assert changes[0] == ["n0007", 1.0, 0.0, 5, 5] and len(changes) == 5
    assert metrics.class_changes(result, better) == []
    assert len(json.dumps(result)) < 60000  # a report line, not a matrix


@pytest.mark.gpu_wheel
def test_checkpoints_hold_everything_needed(trained):
    for epoch in (1, 2, 3):
        directory = run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", epoch)
        meta, state = ckpt.read_checkpoint(directory)
        assert meta["epoch"] == epoch and meta["global_step"] == 10 * epoch
        assert meta["config"]["model"]["arch"] == "resnet18"
        assert any(name.endswith("_velocity_0") for name in state)  # optimizer state
        assert any(name.endswith(".w_1") for name in state)  # BN running mean
    with open(os.path.join(trained.run.output_dir, "classes.json")) as handle:
        assert len(json.load(handle)) == 10
    assert not glob.glob(os.path.join(trained.run.output_dir, "resnet18", ".*"))


@once
def test_evaluation_is_exact_whatever_the_batch_size(trained, fmnist_root):
    results = []
    for batch_size in (16, 7, 130):
        config = build_config(
            dict(
                flat(trained),
                **{
                    "run.run_scope": "eval_only",
                    "data.batch_size": batch_size,
                    "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
                    "run.report_file": os.path.join(
                        trained.run.output_dir, f"eval{batch_size}.json"
                    ),
                },
            )
        )
        results.append(run(config))
    assert len(results) == 3
    for result in results:
        assert result["val.images"] == 130
        assert result["val.top1"] * 130 == pytest.approx(round(result["val.top1"] * 130))
        assert result["val.top1"] == results[0]["val.top1"]
        assert result["val.top5"] == results[0]["val.top5"]
        assert result["val.loss"] == pytest.approx(results[0]["val.loss"], rel=1e-5)
    final = records(trained, "EPOCH")[-1]["data"]
    assert final["val.top1"] == results[0]["val.top1"]


@pytest.mark.gpu_wheel
def test_resume_continues_exactly(fmnist_root, tmp_path):
    """Three epochs straight, and one epoch + resume + two: bit-identical weights.

    Both runs are fresh processes: earlier oneDNN inference in this process could
    change which CPU kernels later training picks.
    """
    flags = ("--epochs", "3", "--run-scope", "train_only")
    straight, resumed, said = straight_and_resumed(fmnist_root, tmp_path, *flags)
    assert "resumed from" in said
    # the data check's line (its warnings would follow it)
    assert (
        "s; --no-data-check skips it): train: 10 classes, 160 images, 16 per class; no findings"
        in said
    )
    resumed_epochs = [
        r["step"] for r in read_report(str(resumed / "report.json")) if r["type"] == "EPOCH"
    ]
    assert resumed_epochs == [[2], [3]]
    assert_same_state(
        ckpt.read_checkpoint(str(resumed / "resnet18" / "3"))[1],
        ckpt.read_checkpoint(str(straight / "resnet18" / "3"))[1],
    )


def test_crash_while_saving_keeps_previous_checkpoint(trained, tmp_path, monkeypatch):
    source = run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 2)
    programs_dir = tmp_path / "resnet18"
    target = str(programs_dir / "2")
    shutil.copytree(source, target)
    before = ckpt.read_checkpoint(target)[1]

    def crash(program, prefix):
        with open(prefix + ".pdparams", "wb") as handle:
            handle.write(b"partial")
        raise KeyboardInterrupt("killed during save")

    monkeypatch.setattr(paddle.static, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(paddle.static.Program(), target, {"epoch": 2})
    after = ckpt.read_checkpoint(str(programs_dir))[1]  # newest complete one
    assert after.keys() == before.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_truncated_checkpoint_is_named(trained, tmp_path):
    copy = str(tmp_path / "3")
    shutil.copytree(run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), copy)
    params = os.path.join(copy, "model.pdparams")
    with open(params, "r+b") as handle:
        handle.truncate(os.path.getsize(params) // 2)
    with pytest.raises(CheckpointError, match=r"model.pdparams: truncated or modified"):
        ckpt.read_checkpoint(copy)
    with pytest.raises(CheckpointError, match="cannot be read"):
        ckpt.read_state(params)
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.read_checkpoint(str(tmp_path / "missing"))


@once
def test_pretrained_params_skip_mismatched_classifier(trained, fmnist_root, tmp_path, capsys):
    params = os.path.join(
        run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), "model.pdparams"
    )
    config = small_config(
        fmnist_root,
        tmp_path,
        **{
            "run.epochs": 1,
            "run.run_scope": "train_only",
            "model.num_classes": 10,
            "run.from_pretrained_params": params,
        },
    )
    train.run(config)
    assert "skipped" not in capsys.readouterr().out
    subset = tmp_path / "five"
    for split in ("train", "val"):
        for name in sorted(os.listdir(os.path.join(fmnist_root, split)))[:5]:
            os.makedirs(subset / split, exist_ok=True)
            os.symlink(os.path.join(fmnist_root, split, name), subset / split / name)
    config = small_config(
        str(subset),
        tmp_path / "five_out",
        **{
            "run.epochs": 1,
            "run.run_scope": "train_only",
            "model.num_classes": 5,
            "run.from_pretrained_params": params,
        },
    )
    train.run(config)
    out = capsys.readouterr().out
    assert (
        "pretrained parameter skipped: linear_0.w_0 (shape (512, 10) in the file, (512, 5) here)"
        in out
    )
    assert "linear_0.b_0" in out and out.count("skipped") == 2


def test_evaluation_rejects_weights_of_another_model(trained):
    config = build_config(
        dict(
            flat(trained),
            **{
                "run.run_scope": "eval_only",
                "model.arch": "resnet34",
                "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
            },
        )
    )
    with pytest.raises(CheckpointError, match="does not fit resnet34"):
        run(config)


@once
def test_benchmark_mode_times_the_requested_steps_and_saves_nothing(fmnist_root, tmp_path):
    config = small_config(
        fmnist_root,
        tmp_path,
        **{
            "run.benchmark": True,
            "run.benchmark_steps": 4,
            "run.benchmark_warmup_steps": 12,
            "run.run_scope": "train_only",
        },
    )
    started = time.perf_counter()
    result = run(config)
    elapsed = time.perf_counter() - started
    # 12 warm-up + 4 timed steps cross the 10-step epoch: the loader restarts unnoticed.
    assert result["benchmark_steps"] == 4 and result["world_size"] == 1
    # Images per second, not batches or milliseconds: the 4 timed steps of 16 images
    # happened inside this call, and a typical step's throughput is near the reported one.
    assert result["train.ips"] >= 4 * 16 / elapsed
    assert 0.25 < result["train.ips"] * result["train.step_ms_p50"] / (1000.0 * 16) < 4
    assert 0 < result["train.step_ms_p50"] <= result["train.step_ms_p90"]
    assert [r["data"] for r in records(config, "SUMMARY") if r["step"] == "BENCHMARK"] == [result]
    assert not records(config, "EPOCH") and not records(config, "VAL")
    assert not os.path.exists(os.path.join(config.run.output_dir, "resnet18"))


def plot(report, image):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "plot_report.py"), report]
        + ["--output", str(image)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plot_report_draws_the_last_run_that_trained(trained, tmp_path):
    """The training run's curves, although an evaluation of its checkpoint was appended
    to the same report after it; a report of evaluations alone is one line."""
    report = tmp_path / "report.json"
    shutil.copy(trained.report_file, report)
    with Report(str(report)) as evaluation:  # what an eval_only run appends
        evaluation.log([3], {"val.top1": 0.5, "val.loss": 1.0}, kind="VAL", console=False)
    image = tmp_path / "curves.png"
    result = plot(str(report), image)
    assert result.returncode == 0, result.stderr
    with open(image, "rb") as handle:
        header = handle.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    # curves over the per-class panels, figsize 15x10 at 100 dpi
    assert (width, height) == (1500, 1000)
    many = tmp_path / "many.json"  # a 1,000-class validation: the most confused pairs
    with Report(str(many)) as compact:
        for record in read_report(trained.report_file):
            if record["type"] in ("RUN", "LOG", "VAL"):
                compact.log(record["step"], record["data"], kind=record["type"], console=False)
        labels = np.repeat(np.arange(1000), 3)
        confusion = metrics.confusion_counts(((labels * 7) % 1000)[:, None], labels, 1000)
        classes = [f"n{i:04d}" for i in range(1000)]
        compact.log([3], metrics.class_results(confusion, classes), kind="CLASSES", console=False)
    assert plot(str(many), tmp_path / "many.png").returncode == 0
    evaluations = tmp_path / "evaluations.json"
    with Report(str(evaluations)) as evaluation:
        evaluation.log([3], {"val.top1": 0.5, "val.loss": 1.0}, kind="VAL", console=False)
    refused = plot(str(evaluations), tmp_path / "none.png")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == f"error: {evaluations}: no run in it logged training steps"


@once
def test_visualdl_logs_the_training_and_validation_scalars(fmnist_root, tmp_path):
    logdir = tmp_path / "vdl"
    config = small_config(
        fmnist_root, tmp_path / "out", **{"run.epochs": 1, "run.visualdl_log_dir": str(logdir)}
    )
    run(config)
    files = os.listdir(logdir)
    assert len(files) == 1 and files[0].startswith("vdlrecords.")
    reader = LogReader(file_path=str(logdir / files[0]))
    tags = reader.get_tags()["scalar"]
    assert {"train/loss", "train/lr", "train/ips", "val/top1", "val/loss"} <= set(tags)
    logged = [r["data"]["loss"] for r in records(config, "LOG")]
    assert [round(p.value, 4) for p in reader.get_data("scalar", "train/loss")] == [
        round(v, 4) for v in logged
    ]
    val = records(config, "VAL")[0]["data"]["val.top1"]
    assert reader.get_data("scalar", "val/top1")[0].value == pytest.approx(val, abs=1e-6)


def test_compare_classes_names_the_classes_a_model_lost(trained, tmp_path):
    """scripts/compare_classes.py: each validation of a run against another's last, with
    the classes that lost most (here the first epochs against the third)."""
    output = tmp_path / "classes.json"
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "compare_classes.py")]
        + [trained.report_file, trained.report_file, "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(output.read_text())["rows"]
    assert [row["epoch"] for row in rows] == [3, 1, 2, 3] and rows[-1]["lost_most"] == []
    final = records(trained, "CLASSES")[-1]["data"]
    for row, per_class in zip(rows[1:], records(trained, "CLASSES")):
        # by hand from the two confusion matrices: the images each class got right
        right = [per_class["data"]["confusion"][i][i] for i in range(len(final["classes"]))]
        right_finally = [final["confusion"][i][i] for i in range(len(final["classes"]))]
        lost = [
            (name, before - after)
            for name, before, after in zip(final["classes"], right_finally, right)
            if before > after
        ]
        expected = sorted(lost, key=lambda change: -change[1])[:5]
        assert [(change[0], change[3]) for change in row["lost_most"]] == expected, row
        assert row["balanced_top1"] == per_class["data"]["balanced_top1"]
    assert result.stdout.splitlines()[-2].endswith("no class lost an image")


@once
def test_compare_runs_names_the_variant_that_failed_in_one_line(tmp_path):
    """scripts/compare_runs.py as a user runs it: a variant whose training fails ends the
    comparison with that command and train.py's own line, status 2, and no output file."""
    missing, output = tmp_path / "missing", tmp_path / "runs.json"
    result = run_python(
        "scripts/compare_runs.py", "--output", str(output), "--variant", "plain=", "--",
        "--config", "resnet18_demo", "--image-root", str(missing),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: --config resnet18_demo --image-root {missing} failed: "
        f"error: image root '{missing}' does not exist or is not a folder"
    )
    assert not output.exists()
