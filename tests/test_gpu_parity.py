"""Parity with NVIDIA's 2024 Paddle ResNet-50, as far as a CPU can check it: the GPU
settings as data (build strategy, flags, Fleet fields, --fuse-resunit), the 4-channel
and fp16 DALI output and a 4-channel model, CPU affinity from real nvidia-smi outputs,
the profiling window, export at the end of training, and NVIDIA's flag names."""

import json
import os

import numpy as np
import paddle
import pytest

from conftest import ROOT, flat, once, small_config
from paddle_resnet.commands import train
from paddle_resnet.core import affinity, devices, feeds
from paddle_resnet.core.cli import build_parser, config_from_args
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import ConfigError, UserError
from paddle_resnet.core.report import Report
from paddle_resnet.data.dali import DataSplit, make_loader
from paddle_resnet.data.folder import scan_split
from paddle_resnet.deploy import export as exporting
from paddle_resnet.deploy import exported, inference_modes, predictor
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import gpu_tuning, profiling, run_folder
from paddle_resnet.training import programs as program
from paddle_resnet.training.weights import pretrained_file, read_weights

FUSIONS = {
    "fuse_bn_act_ops": True,
    "fuse_elewise_add_act_ops": True,
    "fuse_bn_add_act_ops": True,
    "enable_addto": True,
}
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


@pytest.mark.parametrize("amp, pure", [(False, False), (True, False), (True, True)])
def test_build_strategy_and_fleet_fields_per_precision(amp, pure):
    config = build_config({"amp.enabled": amp, "amp.use_pure_fp16": pure})
    train_fields = gpu_tuning.build_strategy_fields(config, training=True)
    eval_fields = gpu_tuning.build_strategy_fields(config, training=False)
    assert train_fields == (FUSIONS if amp else {})
    assert eval_fields == dict(train_fields, fix_op_run_order=True)
    kept = program.distributed_strategy(config, on_gpu=True).build_strategy  # Fleet's copy
    for name in ("fuse_bn_act_ops", "fuse_elewise_add_act_ops", "enable_addto"):
        assert getattr(kept, name) == amp
    strategy = program.distributed_strategy(config, on_gpu=True)
    assert strategy.cudnn_batchnorm_spatial_persistent == amp


def test_cpu_runs_get_no_gpu_settings():
    config = build_config({"amp.enabled": True})
    strategy = program.distributed_strategy(config, on_gpu=False)
    assert not strategy.build_strategy.fuse_bn_act_ops
    assert not strategy.cudnn_batchnorm_spatial_persistent
    programs = program.build_programs(config, steps_per_epoch=1, global_batch=2, on_gpu=False)
    assert programs.eval_compiled is None  # the eval program runs as built
    # (built for a GPU: tests/test_gpu_build.py)


def test_fuse_resunit_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="needs --amp"):
        gpu_tuning.check_resunit(build_config({"amp.fuse_resunit": True}), on_gpu=True)
    with pytest.raises(ConfigError, match="needs NVIDIA GPUs"):
        gpu_tuning.check_resunit(
            build_config({"amp.enabled": True, "amp.fuse_resunit": True}), on_gpu=False
        )
    # PyPI's Paddle has no cuDNN-frontend build: on a GPU it is named, not ignored
    # (NVIDIA's NGC builds have the pass, and pass this check).
    wanted = build_config({"amp.enabled": True, "amp.fuse_resunit": True})
    if gpu_tuning._has_resunit_pass():
        gpu_tuning.check_resunit(wanted, on_gpu=True)
    else:
        with pytest.raises(ConfigError, match="not built with the cuDNN frontend"):
            gpu_tuning.check_resunit(wanted, on_gpu=True)


def loader_batch(root, layout="NCHW", channels=3, **data):
    config = build_config(
        {
            f"data.{k}": v
            for k, v in dict(
                {"image_root": root, "batch_size": 8, "crop_size": 32, "resize_short": 32}, **data
            ).items()
        }
    )
    split = DataSplit.of_images("val", scan_split(root, "val"))
    return next(iter(make_loader(split, config.data, layout, False, channels=channels)))[
        feeds.IMAGE
    ]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_four_channel_pipeline_pads_a_zero_channel(fmnist_root, layout):
    three = loader_batch(fmnist_root, layout)
    four = loader_batch(fmnist_root, layout, channels=4)
    axis = 1 if layout == "NCHW" else 3
    assert four.shape[axis] == 4 and four.dtype == np.float32
    np.testing.assert_array_equal(np.take(four, [0, 1, 2], axis=axis), three)
    assert not np.take(four, 3, axis=axis).any()


@once
def test_fp16_pipeline_output_trains_on_the_cpu(fmnist_root, tmp_path):
    half = loader_batch(fmnist_root, output_fp16=True)
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), loader_batch(fmnist_root), atol=4e-3)
    config = small_config(fmnist_root, tmp_path, **{"data.output_fp16": True, "run.epochs": 1})
    programs = program.build_programs(config, steps_per_epoch=10, global_batch=16)
    image = programs.train.global_block().var(feeds.IMAGE)
    assert image.dtype == paddle.float16  # cast to fp32 inside the program
    result = train.run(config, report_stream=open(os.devnull, "w"))
    assert np.isfinite(result["train.loss"]) and result["val.images"] == 130


@pytest.fixture(scope="module")
def four_channel_run(fmnist_root, tmp_path_factory):
    """NVIDIA's --image-shape 4,H,W, trained 1 epoch on the CPU with a profiling window,
    exported at the end of training (train.py --inference-dir)."""
    out = tmp_path_factory.mktemp("four")
    args = [
        "--image-root",
        fmnist_root,
        "--model-arch-name",
        "resnet18",
        "--num-of-class",
        "10",
        "--image-shape",
        "4,32,32",
        "--resize-short",
        "32",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--warmup-epochs",
        "0",
        "--lr",
        "0.4",
        "--checkpoint-dir",
        str(out),
        "--inference-dir",
        str(out / "inference"),
        "--profile-start-step",
        "2",
        "--profile-stop-step",
        "4",
    ]
    config = config_from_args(build_parser("train").parse_args(args))
    result = train.run(config, report_stream=open(os.devnull, "w"))
    return config, result


def test_four_channels_train_export_at_the_end_and_predict(four_channel_run, fmnist_root):
    config, result = four_channel_run
    assert config.model.image_channels == 4 and config.data.crop_size == 32
    info = exported.read_info(str(config.inference.model_dir))
    assert info["input_shape"] == [4, 32, 32]
    accuracy_config = build_config(
        dict(flat(config), **{"inference.backend": "cpu", "inference.mode": "accuracy"})
    )
    measured = inference_modes.accuracy(accuracy_config, Report(None, enabled=False))
    assert measured["top1"] == result["val.top1"]


@once
def test_export_at_the_end_equals_export_model(four_channel_run, tmp_path):
    config, _ = four_channel_run
    again = build_config(
        dict(
            flat(config),
            **{
                "run.from_checkpoint": run_folder.checkpoint_dir(
                    config.run.output_dir, "resnet18", 1
                ),
                "inference.model_dir": str(tmp_path / "again"),
                "inference.export_log_path": str(tmp_path / "export.json"),
            },
        )
    )
    exporting.export(again)
    at_end, by_tool = str(config.inference.model_dir), str(tmp_path / "again")
    assert exported.read_info(at_end) == exported.read_info(by_tool)
    expected, actual = exported.read_params(by_tool), exported.read_params(at_end)
    assert expected and set(actual) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def test_profiling_window_writes_a_trace_on_the_cpu(four_channel_run):
    config, _ = four_channel_run
    traces = os.listdir(os.path.join(config.run.output_dir, profiling.TRACE_FOLDER))
    assert len(traces) == 1 and traces[0].endswith(".json")
    with open(os.path.join(config.run.output_dir, profiling.TRACE_FOLDER, traces[0])) as handle:
        trace = json.load(handle)
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("conv2d" in name for name in names)
    # NVTX ranges and the CUDA profiler's capture only where a GPU runs the steps
    assert (profiling._nvtx() is not None) == devices.gpu_available()


def test_affinity_of_a_dgx_a100():
    with open(os.path.join(FIXTURES, "nvidia_smi_topo_dgx_a100.txt")) as handle:
        affinities = affinity.gpu_affinities(handle.read())
    assert affinities == {
        0: "48-63,176-191",
        1: "48-63,176-191",
        2: "16-31,144-159",
        3: "16-31,144-159",
        4: "112-127,240-255",
        5: "112-127,240-255",
        6: "80-95,208-223",
        7: "80-95,208-223",
    }
    # Two GPUs per NUMA node: even cores and their hyper-threads for the first, odd for the second.
    assert affinity.cores_for_gpu(affinities, 0) == list(range(48, 64, 2)) + list(
        range(176, 192, 2)
    )
    assert affinity.cores_for_gpu(affinities, 7) == list(range(81, 96, 2)) + list(
        range(209, 224, 2)
    )
    with pytest.raises(UserError, match="no GPU8"):
        affinity.cores_for_gpu(affinities, 8)


def test_affinity_of_an_h100_class_machine_with_lost_tabs():
    """Published with tabs missing in its header and half its rows (NVIDIA's tab-split
    parser fails on it); four GPUs per NUMA node."""
    with open(os.path.join(FIXTURES, "nvidia_smi_topo_h100_class.txt")) as handle:
        affinities = affinity.gpu_affinities(handle.read())
    assert set(affinities.values()) == {"0-55,112-167", "56-111,168-223"}
    cores = affinity.cores_for_gpu(affinities, 5)
    assert cores == list(range(57, 112, 4)) + list(range(169, 224, 4))
    every = sorted(c for gpu in range(8) for c in affinity.cores_for_gpu(affinities, gpu))
    assert every == list(range(224))  # each core to exactly one GPU
    with pytest.raises(UserError, match="no GPU rows"):
        affinity.gpu_affinities("NVIDIA-SMI has failed")


# NVIDIA's 2024 flag names (utils/config.py), with the values its scripts pass.
TRAIN_ALIASES = [
    (["--checkpoint-dir", "/tmp/c"], "run.output_dir", "/tmp/c"),
    (["--inference-dir", "/tmp/i"], "inference.model_dir", "/tmp/i"),
    (["--last-epoch-of-checkpoint", "auto"], "run.last_epoch_of_checkpoint", "auto"),
    (["--model-prefix", "resnet_50_paddle"], "run.model_prefix", "resnet_50_paddle"),
    (["--image-shape", "4,224,224"], "model.image_channels", 4),
    (["--normalize-scale", "1"], "data.normalize_scale", 1.0),
    (["--dali-output-fp16"], "data.output_fp16", True),
    (["--fuse-resunit"], "amp.fuse_resunit", True),
    (["--enable-cpu-affinity", "False"], "run.cpu_affinity", False),
    (["--qat"], "qat.enabled", True),
    (["--optimizer", "Momentum"], "optimizer.name", "Momentum"),
    (["--lr-scheduler", "Cosine"], "lr.schedule", "cosine"),  # NVIDIA capitalises
    (["--model-arch-name", "ResNet50"], "model.arch", "ResNet50"),  # registry: any case
]
INFERENCE_ALIASES = [
    (["--precision", "FP16"], "inference.trt_precision", "FP16"),
    (["--workspace-size", str(1 << 30)], "inference.trt_workspace_size", 1 << 30),
    (["--min-subgraph-size", "5"], "inference.trt_min_subgraph_size", 5),
    (["--use-static", "True"], "inference.trt_use_static", True),
    (["--use-calib-mode", "True"], "inference.trt_use_calib_mode", True),
    (["--use-synthetic", "True"], "inference.use_synthetic", True),
    (["--trt-use-synthat"], "inference.use_synthetic", True),  # deprecated, warns
    (["--device", "3"], "inference.device_id", 3),
]


@pytest.mark.parametrize("argv, dotted, value", TRAIN_ALIASES + INFERENCE_ALIASES)
def test_nvidia_flag_names_reach_our_keys(argv, dotted, value):
    config = config_from_args(
        build_parser(
            "inference" if (argv, dotted, value) in INFERENCE_ALIASES else "train"
        ).parse_args(argv)
    )
    section, _, name = dotted.partition(".")
    assert getattr(getattr(config, section), name) == value


def test_nvidia_values_are_checked():
    with pytest.raises(ConfigError, match="expects true or false"):
        config_from_args(build_parser("inference").parse_args(["--use-static", "maybe"]))
    parser = build_parser("export_model")
    with pytest.raises(ConfigError, match="must be auto or an epoch"):
        config_from_args(parser.parse_args(["--last-epoch-of-checkpoint", "latest"]))
    with pytest.raises(ConfigError, match="square"):
        config_from_args(parser.parse_args(["--image-shape", "4,224,192"]))
    with pytest.raises(ConfigError, match="must be one of 3, 4"):
        config_from_args(parser.parse_args(["--image-shape", "2,224,224"]))
    # two flags that disagree about one key: refused, not the last one silently
    with pytest.raises(
        ConfigError,
        match="--image-shape 4,32,32 sets --image-channels 4, but --image-channels 3 is given too",
    ):
        config_from_args(parser.parse_args(["--image-shape", "4,32,32", "--image-channels", "3"]))
    with pytest.raises(ConfigError, match="sets --crop-size 32, but --crop-size 64"):
        config_from_args(parser.parse_args(["--image-shape", "4,32,32", "--crop-size", "64"]))
    agreeing = ["--image-shape", "4,32,32", "--image-channels", "4", "--resize-short", "32"]
    assert config_from_args(parser.parse_args(agreeing)).model.image_channels == 4
    # NVIDIA passes the TensorRT workspace in bytes under an "MB" help text
    assert predictor.workspace_bytes(1 << 30) == predictor.workspace_bytes(1024) == 1 << 30


@once
def test_last_epoch_and_model_prefix_find_nvidia_style_checkpoints(trained, tmp_path):
    folder = os.path.join(trained.run.output_dir, "resnet18")
    config = build_config(
        dict(flat(trained), **{"run.from_checkpoint": folder, "run.last_epoch_of_checkpoint": "2"})
    )
    assert read_weights(config.run)[0]["epoch"] == 2  # not the newest (3)
    programs = program.build_programs(trained, training=False)
    meta = {"epoch": 5, "classes": [str(i) for i in range(10)], "config": trained.to_dict()}
    ckpt.save_checkpoint(programs.eval, str(tmp_path / "5"), meta, prefix="resnet_50_paddle")
    assert os.path.exists(tmp_path / "5" / "resnet_50_paddle.pdparams")
    assert ckpt.read_checkpoint(str(tmp_path / "5"))[0]["epoch"] == 5
    pretrained = build_config(
        {"run.from_pretrained_params": str(tmp_path / "5"), "run.model_prefix": "resnet_50_paddle"}
    )
    assert pretrained_file(pretrained.run).endswith("5/resnet_50_paddle.pdparams")
