"""Each tool reads every config key whose flag it accepts (the tools are declared on the
keys in core/config/): the tool's real command runs with the reads of the Config
recorded, and a key it accepts but never reads fails the test, naming the key."""

import dataclasses
import os
import sys

import pytest

from conftest import FAST_TRAIN, once
from paddle_resnet.commands import check_data, export_model, inference, train
from paddle_resnet.core import config as config_module
from paddle_resnet.core.cli import tool_reads
from paddle_resnet.core.config import AmpConfig, Config, InferenceConfig, all_keys
from paddle_resnet.deploy import predictor
from paddle_resnet.training import programs

# Static checks of the command lines: run once, on 2.6.2.
pytestmark = once

SECTIONS = {f.type: f.name for f in dataclasses.fields(Config)}
# Code that copies, prints or checks every field, which proves nothing about the tool.
WHOLE_CONFIG_READERS = {"validate", "to_dict", "to_yaml", "run_differences", "_problem"}


def reads_whole_config(frame):
    code = frame.f_code
    return code.co_filename == dataclasses.__file__ or (
        code.co_filename == config_module.__file__ and code.co_name in WHOLE_CONFIG_READERS
    )


@pytest.fixture
def recorded_reads(monkeypatch):
    """The set of "section.key" names read by the code under test."""
    reads = set()
    for section_type, section in SECTIONS.items():
        names = {f.name for f in dataclasses.fields(section_type)}

        def recording(self, name, section=section, names=names):
            if name in names and not reads_whole_config(sys._getframe(1)):
                reads.add(f"{section}.{name}")
            return object.__getattribute__(self, name)

        monkeypatch.setattr(section_type, "__getattribute__", recording)
    return reads


def unread(tool, reads):
    return sorted(d for d, _ in all_keys() if tool_reads(tool, d) and d not in reads)


def run_tool(main, argv):
    assert main(argv) == 0


def test_train_reads_every_key_it_accepts(recorded_reads, fmnist_root, tmp_path):
    argv = list(FAST_TRAIN) + ["--image-root", fmnist_root, "--output-dir", str(tmp_path)]
    run_tool(train.main, argv)
    resume = ["--from-checkpoint", str(tmp_path / "resnet18"), "--epochs", "2"]
    profile = ["--profile-start-step", "12", "--report-file", str(tmp_path / "resumed.json")]
    run_tool(train.main, argv + resume + profile)
    # the keys read only when another is set: a second run sets those others
    run_tool(
        train.main,
        argv[:-1]
        + [str(tmp_path / "b"), "--benchmark", "--benchmark-steps", "2"]
        + ["--benchmark-warmup-steps", "1"]
        + ["--lr-scheduler", "step", "--warmup-epochs", "0.1", "--asp", "--prune-model"],
    )
    # AMP is GPU-only: its Fleet strategy is built here as data, as on a GPU machine
    amp = dataclasses.replace(Config(), amp=AmpConfig(enabled=True))
    programs.distributed_strategy(amp, on_gpu=True)
    assert not unread("train", recorded_reads)


def test_export_and_inference_read_every_key_they_accept(recorded_reads, trained, tmp_path):
    model_dir = str(tmp_path / "model")
    checkpoint = os.path.join(trained.run.output_dir, trained.model.arch)
    common = ["--image-root", trained.data.image_root, "--crop-size", "32", "--resize-short", "32"]
    run_tool(
        export_model.main,
        common
        + ["--model-arch-name", "resnet18", "--num-of-class", "10"]
        + ["--from-checkpoint", checkpoint, "--inference-dir", model_dir, "--verify-images", "16"],
    )
    # from pretrained parameters, post-training quantized
    run_tool(
        export_model.main,
        common
        + ["--model-arch-name", "resnet18", "--num-of-class", "10"]
        + ["--from-pretrained-params", os.path.join(checkpoint, "3"), "--model-prefix", "model"]
        + ["--inference-dir", str(tmp_path / "int8"), "--ptq-algo", "avg"]
        + ["--calibration-images", "16"],
    )
    assert not unread("export_model", recorded_reads)
    recorded_reads.clear()
    images = os.path.join(trained.data.image_root, "val", "bag")
    for mode in (
        ["accuracy"],
        ["benchmark", "--use-synthetic", "--benchmark-steps", "2", "--benchmark-warmup-steps", "1"],
        ["predict", "--images", images],
    ):
        run_tool(inference.main, ["--inference-dir", model_dir, "--mode"] + mode + common[:2])
    # TensorRT is GPU-only: its predictor settings are built here as data
    trt_int8 = InferenceConfig(trt_precision="INT8")
    predictor.predictor_settings(trt_int8, "trt", [3, 32, 32], 8, quantized=True)
    assert not unread("inference", recorded_reads)


def test_check_data_reads_every_key_it_accepts(recorded_reads, fmnist_root, tmp_path):
    argv = ["--image-root", fmnist_root, "--crop-size", "28", "--dali-num-threads", "1"]
    run_tool(check_data.main, argv + ["--decode", "--json", str(tmp_path / "check.json")])
    assert not unread("check_data", recorded_reads)
