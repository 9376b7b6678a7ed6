"""2:4 sparsity: masks on real weights, kept through training, checkpoints and export."""

import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from conftest import flat, once, small_config
from paddle_resnet.commands import train
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import CheckpointError, ConfigError
from paddle_resnet.core.report import read_report
from paddle_resnet.deploy import export as exporting
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import programs as program
from paddle_resnet.training import run_folder
from paddle_resnet.training.sparsity import pattern as sparsity

# The GPU build of Paddle changes how these programs are built: also run there
# (scripts/test.sh's GPU-wheel track).


def quiet():
    return open(os.devnull, "w")


def weights_of(config, epoch):
    return ckpt.read_checkpoint(
        run_folder.checkpoint_dir(config.run.output_dir, config.model.arch, epoch)
    )[1]


# 4:8 for the algorithms that scale to it; mask_2d_best enumerates every valid block
# (about 10^11 at 8x8), so it shows the pattern driving it at 1:4.
@pytest.mark.parametrize(
    "algo, kept, group", [("mask_1d", 4, 8), ("mask_2d_greedy", 4, 8), ("mask_2d_best", 1, 4)]
)
def test_the_pattern_is_data_the_mask_algorithms_follow(algo, kept, group):
    """With another N:M pattern as data, each mask algorithm computes a mask of that
    pattern: NVIDIA's 2:4 is the toolkit's choice (``masks.PATTERN``), not theirs."""
    other = sparsity.Pattern(kept=kept, group=group)
    weight = np.random.default_rng(0).normal(size=(16, 24, 3, 3))  # conv [out, in, kh, kw]
    pruned = weight * sparsity.prune_mask(weight, algo, other)
    # the pattern asked for, and no stricter one (4:8 is not 2:4; 1:4 is, so the stricter
    # pattern is the one keeping a weight fewer)
    stricter = sparsity.Pattern(kept=kept - 1, group=group)
    assert sparsity.holds(pruned, other) and not sparsity.holds(pruned, stricter)
    assert sparsity.density(pruned) == pytest.approx(kept / group, abs=0.02)  # greedy: at most
    if algo != "mask_1d":  # 2-D masks also hold along the outputs of each block
        rows = sparsity.paddle_rows(pruned)
        blocks = rows[: rows.shape[0] // group * group].reshape(-1, group, rows.shape[1])
        assert ((blocks != 0).sum(axis=1) <= kept).all()


@pytest.mark.gpu_wheel
@pytest.mark.parametrize("algo", ["mask_1d", "mask_2d_greedy", "mask_2d_best"])
def test_mask_algorithms_give_2to4_on_real_weights(trained, algo):
    state = weights_of(trained, 3)
    conv = state["conv2d_5.w_0"]  # layer1: [64, 64, 3, 3]
    fc = state["linear_0.w_0"]  # [512, 10]
    for weight in (conv, fc):
        pruned = weight * sparsity.prune_mask(weight, algo, sparsity.NVIDIA_2_4)
        assert sparsity.holds(pruned, sparsity.NVIDIA_2_4)
        # the trained weights were not 2:4 already
        assert not sparsity.holds(weight, sparsity.NVIDIA_2_4)
        assert sparsity.density(pruned) == pytest.approx(0.5, abs=0.01)
        if algo != "mask_1d":  # 2-D masks also hold along the outputs
            rows = sparsity.paddle_rows(pruned)  # the layout the masks are chosen in
            groups = rows[: rows.shape[0] // 4 * 4].reshape(-1, 4, rows.shape[1])
            assert ((groups != 0).sum(axis=1) <= 2).all()


@pytest.fixture(scope="module")
def sparse_run(trained, tmp_path_factory):
    """Prune the trained model (mask_1d, fc and layer4.1.conv2 kept dense), retrain two epochs."""
    out = tmp_path_factory.mktemp("sparse")
    config = build_config(
        dict(
            flat(trained),
            **{
                "asp.enabled": True,
                "asp.prune_model": True,
                "asp.exclude": ("layer4.1.conv2",),
                "optimizer.weight_decay": 1e-3,
                "run.epochs": 2,
                "run.output_dir": str(out),
                "run.from_pretrained_params": os.path.join(
                    run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3),
                    "model.pdparams",
                ),
            },
        )
    )
    train.run(config, report_stream=quiet())
    return config


@pytest.mark.gpu_wheel
def test_pruned_weights_stay_2to4_with_the_same_zeros(sparse_run):
    records = read_report(sparse_run.report_file)
    table = [r for r in records if r["step"] == "ASP"][0]["data"]["layers"]
    status = {row["layer"]: row["status"] for row in table}
    assert status["conv1.weight"].startswith("dense (too few input channels")
    assert status["fc.weight"].startswith("excluded")
    assert status["layer4.1.conv2.weight"].startswith("excluded")
    assert status["layer1.0.conv1.weight"] == "pruned"
    after_one, after_two = weights_of(sparse_run, 1), weights_of(sparse_run, 2)
    pruned = sparsity.sparse_parameters(after_two)
    assert len(pruned) == sum(s == "pruned" for s in status.values()) == 18
    # the checkpoint names its pattern and the weights that hold it
    meta = ckpt.read_checkpoint(
        run_folder.checkpoint_dir(sparse_run.run.output_dir, "resnet18", 2)
    )[0]
    assert meta["sparsity"] == {"pattern": "2:4", "weights": pruned}
    for name in pruned:
        assert sparsity.holds(after_two[name], sparsity.NVIDIA_2_4), name
        np.testing.assert_array_equal(after_one[name] == 0, after_two[name] == 0)
        assert not np.array_equal(after_one[name], after_two[name])  # it did train
    names = {row["layer"]: row["param"] for row in table}
    for dense in ("fc.weight", "layer4.1.conv2.weight"):
        assert sparsity.density(after_two[names[dense]]) > 0.99
    val = [r for r in records if r["type"] == "VAL"]
    assert val[0]["step"] == [0]  # evaluated right after pruning


@pytest.mark.gpu_wheel
def test_resume_keeps_the_masks(sparse_run, tmp_path):
    config = build_config(
        dict(
            flat(sparse_run),
            **{
                "asp.prune_model": False,
                "run.from_pretrained_params": None,
                "run.epochs": 3,
                "run.output_dir": str(tmp_path),
                "run.from_checkpoint": run_folder.checkpoint_dir(
                    sparse_run.run.output_dir, "resnet18", 2
                ),
            },
        )
    )
    train.run(config, report_stream=quiet())
    before, after = weights_of(sparse_run, 2), weights_of(config, 3)
    masked = sparsity.sparse_parameters(before)
    assert len(masked) == 18  # 19 eligible convolutions, layer4.1.conv2 kept dense
    for name in masked:
        np.testing.assert_array_equal(after[name + ".asp_mask"], before[name + ".asp_mask"])
        assert sparsity.holds(after[name], sparsity.NVIDIA_2_4)


@once
def test_export_keeps_the_pattern_and_checker_flags_a_dense_weight(sparse_run, tmp_path):
    model_dir = str(tmp_path / "model")
    config = build_config(
        dict(
            flat(sparse_run),
            **{
                "run.from_pretrained_params": None,
                "inference.model_dir": model_dir,
                "inference.export_log_path": str(tmp_path / "export.json"),
                "run.from_checkpoint": run_folder.checkpoint_dir(
                    sparse_run.run.output_dir, "resnet18", 2
                ),
            },
        )
    )
    report = exporting.export(config)
    assert report["sparsity"]["pattern"] == "2:4" and len(report["sparsity"]["weights"]) == 18
    result = check(model_dir)
    assert result.returncode == 0, result.stderr
    assert "18 weights marked sparse, 0 violate 2:4" in result.stdout
    checkpoint = run_folder.checkpoint_dir(sparse_run.run.output_dir, "resnet18", 2)
    assert check(checkpoint).returncode == 0
    # De-sparsify one pruned weight in a copy of the checkpoint's parameters (which
    # hold the ASP masks too).
    params = ckpt.read_state(os.path.join(checkpoint, "model"), optimizer=False)
    victim = report["sparsity"]["weights"][0]
    assert victim + ".asp_mask" in params
    params[victim] = np.ones_like(params[victim])
    broken = str(tmp_path / "broken")
    paddle.save(params, broken + ".pdparams")
    result = check(broken + ".pdparams")
    assert result.returncode == 1 and f"{victim}" in result.stdout
    missing = check(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].startswith("error: ")


def check(path):
    """The checker as users run it: a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "paddle_resnet.commands.check_sparsity", path],
        capture_output=True,
        text=True,
    )


@pytest.mark.gpu_wheel
def test_bad_asp_input(trained, fmnist_root, tmp_path):
    with pytest.raises(ConfigError, match="--prune-model needs --asp"):
        small_config(fmnist_root, tmp_path, **{"asp.prune_model": True})
    with pytest.raises(ConfigError, match=r"asp.mask_algo \(--mask-algo\) must be one of"):
        small_config(fmnist_root, tmp_path, **{"asp.enabled": True, "asp.mask_algo": "mask_3d"})
    config = small_config(
        fmnist_root, tmp_path, **{"asp.enabled": True, "asp.exclude": ("layer9.conv1",)}
    )
    with pytest.raises(ConfigError, match="'layer9.conv1' matches no layer"):
        program.build_programs(config, steps_per_epoch=10, global_batch=16)
    params = os.path.join(
        run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), "model.pdparams"
    )
    other = small_config(
        fmnist_root,
        tmp_path,
        **{
            "model.arch": "resnet34",
            "asp.enabled": True,
            "asp.prune_model": True,
            "run.from_pretrained_params": params,
        },
    )
    with pytest.raises(CheckpointError, match="does not fit resnet34"):
        train.run(other, report_stream=quiet())


@pytest.mark.gpu_wheel
def test_amp_and_asp_combine_in_one_program(fmnist_root, tmp_path):
    config = small_config(
        fmnist_root,
        tmp_path,
        **{"asp.enabled": True, "amp.enabled": True, "amp.use_dynamic_loss_scaling": True},
    )
    programs = program.build_programs(config, steps_per_epoch=10, global_batch=16)
    ops = programs.train.global_block().ops
    types = [op.type for op in ops]
    assert "check_finite_and_unscale" in types and "update_loss_scaling" in types
    masked = {
        op.input("X")[0]
        for op in ops
        if op.type == "elementwise_mul" and op.input("Y")[0].endswith(sparsity.MASK_SUFFIX)
    }
    assert "conv2d_1.w_0" in masked and "linear_0.w_0" not in masked
