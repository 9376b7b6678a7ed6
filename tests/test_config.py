import dataclasses

import pytest
import yaml

from conftest import once
from paddle_resnet.core.bootstrap import is_verbose
from paddle_resnet.core.cli import build_parser, config_from_args
from paddle_resnet.core.config import build_config, list_recipes, to_yaml
from paddle_resnet.core.errors import ConfigError

# The configuration and command lines: plain Python; run once, on 2.6.2.
pytestmark = once


def parse(*argv):
    return config_from_args(build_parser("train").parse_args(list(argv)))


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
        build_parser("train").parse_args(["--learning-rate", "1"])
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lr", "-0.1"], "lr.base (--lr) must be positive"),
        (["--batch-size", "0"], "data.batch_size (--batch-size) must be at least 1, got 0"),
        (["--batch-size", "two"], "data.batch_size='two'"),
        (["--epochs", "0"], "run.epochs (--epochs) must be at least 1"),
        (
            ["--label-smoothing", "1.5"],
            "loss.label_smoothing (--label-smoothing) must be in [0, 1)",
        ),
        (["--rand-crop-scale", "0.9,0.1"], "data.rand_crop_scale (--rand-crop-scale) must satisfy"),
        (["--data-layout", "NCWH"], "model.data_layout (--data-layout) must be one of NCHW, NHWC"),
        (["--prune-model"], "--prune-model needs --asp"),
        (
            ["--asp", "--prune-model", "--qat"],
            "--prune-model with --qat: prune and fine-tune first",
        ),
        (["--mask-algo", "mask_3d"], "asp.mask_algo (--mask-algo) must be one of"),
        (["--lr-milestones", "60,30"], "lr.milestones (--lr-milestones) must be increasing"),
        (
            ["--color-jitter", "0.4,1.2,0"],
            "data.color_jitter (--color-jitter) must be in [0, 1), got 1.2",
        ),
        (["--from-checkpoint", "a", "--from-pretrained-params", "b"], "exclude each other"),
        (
            ["--warmup-epochs", "10", "--epochs", "5"],
            "lr.warmup_epochs (--warmup-epochs) must be between 0 and run.epochs",
        ),
    ],
)
def test_impossible_values_are_named(argv, message):
    with pytest.raises(ConfigError) as error:
        parse("--image-root", "x", *argv)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_abbreviated_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser("train").parse_args(["--epoch", "3"])
    assert "unrecognized arguments: --epoch" in capsys.readouterr().err


def test_aliases_reach_the_same_key_and_deprecated_ones_warn(capsys):
    config = config_from_args(
        build_parser("inference").parse_args(
            ["--trt-inference-dir", "m", "--trt-log-path", "l.json", "--trt-use-synthat"]
        )
    )
    assert config.inference.model_dir == "m" and config.inference.log_path == "l.json"
    assert config.inference.use_synthetic is True
    assert capsys.readouterr().err.strip() == (
        "warning: --trt-use-synthat is deprecated; use --use-synthetic"
    )
    config = config_from_args(
        build_parser("inference").parse_args(["--inference-dir", "n", "--use-synthetic"])
    )
    assert config.inference.model_dir == "n" and config.inference.use_synthetic is True
    assert capsys.readouterr().err == ""


def test_nvidia_2022_spellings_take_their_values(capsys):
    """NVIDIA's 2022 scripts pass --trt-use-synthat True; the deprecated spelling takes
    a value as the current one does."""
    for value, expected in (("True", True), ("False", False)):
        config = config_from_args(
            build_parser("inference").parse_args(["--trt-use-synthat", value])
        )
        assert config.inference.use_synthetic is expected
    assert "deprecated; use --use-synthetic" in capsys.readouterr().err


@pytest.mark.parametrize(
    "tool, argv, owner",
    [
        ("train", ["--trt-precision", "FP16"], "read by inference.py)"),
        ("export_model", ["--output-dir", "x"], "read by train.py)"),
        ("export_model", ["--cpu-onednn"], "read by train.py)"),
        ("export_model", ["--dali-output-fp16"], "read by train.py)"),
        ("export_model", ["--trt-precision", "FP16"], "read by inference.py)"),
        ("train", ["--ptq-algo", "KL"], "read by export_model.py)"),
        ("inference", ["--epochs", "3"], "read by train.py)"),
        ("inference", ["--model-arch-name", "resnet18"], "read by train.py and export_model.py"),
        ("inference", ["--onnx"], "read by export_model.py)"),
        ("export_model", ["--lr", "0.1"], "read by train.py)"),
        ("export_model", ["--benchmark-batch-sizes", "1,8"], "read by inference.py)"),
        ("export_model", ["--trt-log-path", "x.json"], "read by inference.py)"),
    ],
)
def test_each_tool_refuses_the_flags_of_others(capsys, tool, argv, owner):
    with pytest.raises(SystemExit):
        build_parser(tool).parse_args(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{argv[0]} is not used by {tool}.py" in error and owner in error


def test_each_tool_takes_what_it_reads():
    """The flags the tools' own scripts pass (scripts/deploy/*.sh, NVIDIA's)."""
    export = config_from_args(
        build_parser("export_model").parse_args(
            [
                "--from-checkpoint",
                "c",
                "--trt-inference-dir",
                "m",
                "--amp",
                "--data-layout",
                "NHWC",
                "--image-shape",
                "4,224,224",
                "--qat",
                "--ptq-algo",
                "KL",
                "--verify-images",
                "8",
            ]
        )
    )
    assert export.model.image_channels == 4 and export.inference.ptq_algo == "KL"
    infer = config_from_args(
        build_parser("inference").parse_args(
            [
                "--inference-dir",
                "m",
                "--backend",
                "trt",
                "--precision",
                "FP16",
                "--batch-size",
                "8",
                "--benchmark-steps",
                "10",
                "--benchmark-warmup-steps",
                "2",
                "--use-synthetic",
                "True",
                "--dali-num-threads",
                "2",
                "--verbose",
            ]
        )
    )
    assert infer.inference.trt_precision == "FP16" and infer.run.benchmark_steps == 10
    # but train.py takes --inference-dir: where to export the final model
    assert vars(build_parser("train").parse_args(["--inference-dir", "m"])) == {
        "inference.model_dir": "m"
    }


def test_every_recipe_loads_and_round_trips():
    assert "resnet18_demo" in list_recipes()
    for name in list_recipes():
        config = parse("--config", name, "--image-root", "x")
        flat = {
            f"{s}.{k}": v
            for s, entries in yaml.safe_load(to_yaml(config)).items()
            for k, v in entries.items()
        }
        assert build_config(flat) == config


@pytest.mark.parametrize(
    "argv, verbose",
    [
        ([], False),
        (["--verbose"], True),
        (["--verbose", "--batch-size", "16"], True),
        (["--verbose", "False"], False),
        (["--verbose", "True"], True),
        (["--verbose=0"], False),
        (["--verbose", "--no-verbose"], False),
        (["--no-verbose", "--verbose", "yes"], True),
    ],
)
def test_the_environment_and_the_config_agree_on_verbosity(argv, verbose):
    """Paddle's environment is set from the command line before the parser runs: both
    must read --verbose the same way."""
    assert is_verbose(argv, environ={}) is verbose
    assert parse(*argv).run.verbose is verbose
