import dataclasses

import pytest
import yaml

from paddle_resnet.config import (build_config, build_parser, config_from_args, list_recipes,
                                  to_yaml)
from paddle_resnet.errors import ConfigError


def parse(*argv):
    return config_from_args(build_parser("test").parse_args(list(argv)))


def test_defaults_are_the_nvidia_paddle_recipe():
    config = parse("--image-root", "x")
    assert config.model.arch == "resnet50"
    assert config.optimizer.momentum == 0.875
    assert config.optimizer.weight_decay == 1 / 32768
    assert config.lr.base == 0.256 and config.lr.schedule == "cosine"
    assert config.lr.warmup_epochs == 5 and config.loss.label_smoothing == 0.1
    assert config.data.rand_crop_scale == (0.08, 1.0)


def test_yaml_then_set_then_flags(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: {base: 0.5}\nrun: {epochs: 7}\ndata: {image_root: a, batch_size: 8}\n")
    config = parse("--config", str(recipe), "--set", "run.epochs=9", "--batch-size", "4")
    assert (config.lr.base, config.run.epochs, config.data.batch_size) == (0.5, 9, 4)
    assert config.data.image_root == "a"


def test_config_is_read_only():
    config = parse("--image-root", "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr.base = 1.0


def test_unknown_yaml_key_is_named(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("optimizer: {momentun: 0.9}\n")
    with pytest.raises(ConfigError, match="unknown config key 'optimizer.momentun'"):
        parse("--config", str(recipe), "--image-root", "x")


def test_unknown_section_and_recipe_are_named(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("optimiser: {momentum: 0.9}\n")
    with pytest.raises(ConfigError, match="unknown config section 'optimiser'"):
        parse("--config", str(recipe))
    with pytest.raises(ConfigError, match="config 'no_such_recipe' not found; recipes: "):
        parse("--config", "no_such_recipe")


def test_unknown_flag_exits_with_usage(capsys):
    with pytest.raises(SystemExit):
        build_parser("test").parse_args(["--learning-rate", "1"])
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--lr", "-0.1"], "lr.base (--lr) must be positive"),
    (["--batch-size", "0"], "data.batch_size (--batch-size) must be at least 1, got 0"),
    (["--batch-size", "two"], "data.batch_size='two'"),
    (["--epochs", "0"], "run.epochs (--epochs) must be at least 1"),
    (["--label-smoothing", "1.5"], "loss.label_smoothing (--label-smoothing) must be in [0, 1)"),
    (["--rand-crop-scale", "0.9,0.1"], "data.rand_crop_scale (--rand-crop-scale) must satisfy"),
    (["--data-layout", "NCWH"], "model.data_layout (--data-layout) must be one of NCHW, NHWC"),
    (["--prune-model"], "--prune-model needs --asp"),
    (["--asp", "--prune-model", "--qat"], "--prune-model with --qat: prune and fine-tune first"),
    (["--mask-algo", "mask_3d"], "asp.mask_algo (--mask-algo) must be one of"),
    (["--lr-milestones", "60,30"], "lr.milestones (--lr-milestones) must be increasing"),
    (["--color-jitter", "0.4,1.2,0"], "data.color_jitter (--color-jitter) must be in [0, 1), got 1.2"),
    (["--from-checkpoint", "a", "--from-pretrained-params", "b"], "exclude each other"),
    (["--warmup-epochs", "10", "--epochs", "5"], "lr.warmup_epochs (--warmup-epochs) must be between 0 and run.epochs"),
])
def test_impossible_values_are_named(argv, message):
    with pytest.raises(ConfigError) as error:
        parse("--image-root", "x", *argv)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_abbreviated_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser("test").parse_args(["--epoch", "3"])
    assert "unrecognized arguments: --epoch" in capsys.readouterr().err


def test_aliases_reach_the_same_key_and_deprecated_ones_warn(capsys):
    config = config_from_args(build_parser("t", inference=True).parse_args(
        ["--trt-inference-dir", "m", "--trt-log-path", "l.json", "--trt-use-synthat"]))
    assert config.inference.model_dir == "m" and config.inference.log_path == "l.json"
    assert config.inference.use_synthetic is True
    assert capsys.readouterr().err.strip() == (
        "warning: --trt-use-synthat is deprecated; use --use-synthetic")
    config = config_from_args(build_parser("t", inference=True).parse_args(
        ["--inference-dir", "n", "--use-synthetic"]))
    assert config.inference.model_dir == "n" and config.inference.use_synthetic is True
    assert capsys.readouterr().err == ""


def test_inference_flags_only_where_inference_runs(capsys):
    with pytest.raises(SystemExit):
        build_parser("train").parse_args(["--trt-precision", "FP16"])
    capsys.readouterr()
    # but train.py takes --inference-dir: where to export the final model
    assert vars(build_parser("train").parse_args(["--inference-dir", "m"])) == {
        "inference.model_dir": "m"}


def test_every_recipe_loads_and_round_trips():
    assert "resnet18_demo" in list_recipes()
    for name in list_recipes():
        config = parse("--config", name, "--image-root", "x")
        flat = {f"{s}.{k}": v for s, entries in yaml.safe_load(to_yaml(config)).items()
                for k, v in entries.items()}
        assert build_config(flat) == config
