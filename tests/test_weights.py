"""Importing weights users already have: torchvision / timm (PyTorch and safetensors
files) and PaddleClas, checked output for output on real images against the source
framework's own models; ASP and QAT starting from an imported file; bad files."""

import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
import torch
from PIL import Image
from seeded_weights import CROP, imagenet_normalise, seeded_state

from conftest import ROOT, once, small_config
from paddle_resnet.commands import train
from paddle_resnet.core import feeds
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import CheckpointError
from paddle_resnet.core.report import read_report
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import programs as program
from paddle_resnet.training.sparsity.pattern import NVIDIA_2_4, holds
from paddle_resnet.training.weights import into_program, program_state, read_weights
from paddle_resnet.training.weights.files import read_tensors

# The import is plain Python over NumPy arrays and the program's parameter names, which
# other tests load on both versions.
pytestmark = once

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "paddleclas_reference.npz")


def crops_of(imagenet_root, count=4):
    """The first ``count`` ImageNet JPEGs the tests ship, as uint8 CROP x CROP RGB crops
    (the PaddleClas fixture's own crops are made the same way)."""
    paths = sorted(
        os.path.join(folder, name) for folder, _, names in os.walk(imagenet_root) for name in names
    )[:count]
    return np.stack(
        [
            np.asarray(Image.open(p).convert("RGB").resize((CROP, CROP), Image.BILINEAR))
            for p in paths
        ]
    )


@pytest.fixture(scope="module")
def torch_models(imagenet_root, tmp_path_factory):
    """torchvision and timm models with random weights, saved by tests/torch_reference.py
    in a PyTorch process, with their logits on real images."""
    out = tmp_path_factory.mktemp("torch_models")
    images = imagenet_normalise(crops_of(imagenet_root))
    np.save(out / "images.npy", images)
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "torch_reference.py"),
            str(out),
            str(out / "images.npy"),
        ],
        check=True,
        capture_output=True,
    )
    return out, images


def config_for(arch, tmp_path, num_classes=1000, **values):
    return build_config(
        dict(
            {
                "model.arch": arch,
                "model.num_classes": num_classes,
                "data.crop_size": CROP,
                "run.output_dir": str(tmp_path),
                "run.from_pretrained_params": None,
            },
            **values,
        )
    )


def paddle_logits(config, path, images):
    """Logits of ``config``'s eval program with the weights of ``path`` imported."""
    programs = program.build_programs(config, training=False)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(programs.startup)
    state, _ = program_state(read_tensors(path)[1], None, programs.model, config, path)
    assert not into_program.load_pretrained(programs.eval, state, path, config.model.arch)
    softmax = next(op for op in programs.eval.global_block().ops if op.type == "softmax")
    logits = programs.eval.global_block().var(softmax.input("X")[0])
    labels = np.zeros((len(images), 1), np.int64)
    return exe.run(
        programs.eval, feed={feeds.IMAGE: images, feeds.LABEL: labels}, fetch_list=[logits]
    )[0]


def assert_close(ours, reference):
    """Equal within 1e-4 of the largest logit: float32 convolutions summed in another order."""
    assert ours.shape == reference.shape
    assert np.abs(ours - reference).max() <= 1e-4 * np.abs(reference).max()
    assert (ours.argmax(1) == reference.argmax(1)).all()


@pytest.mark.parametrize(
    "name, arch",
    [
        ("torchvision_resnet50.pth", "resnet50"),
        ("torchvision_resnet18.pth", "resnet18"),
        ("torchvision_resnext50_32x4d.pth", "resnext50_32x4d"),
        ("timm_resnet50.safetensors", "resnet50"),
    ],
)
def test_pytorch_weights_give_the_same_logits(torch_models, tmp_path, name, arch):
    out, images = torch_models
    reference = np.load(out / (name.split(".")[0] + ".logits.npy"))
    assert_close(paddle_logits(config_for(arch, tmp_path), str(out / name), images), reference)


@pytest.mark.parametrize("name", ["paddleclas_resnet50", "paddleclas_resnext50_32x4d"])
def test_paddleclas_weights_give_the_same_logits(tmp_path, name):
    """PaddleClas's models ran in their own environment (tests/fixtures/
    make_paddleclas_reference.py); the same seeded weights are written here as
    paddle.save writes a Layer's state dict, then imported."""
    fixture = np.load(FIXTURE)
    shapes = [(key, tuple(shape)) for key, shape in json.loads(str(fixture[name + ".shapes"]))]
    state = seeded_state(
        shapes, seed=["paddleclas_resnet50", "paddleclas_resnext50_32x4d"].index(name)
    )
    state["StructuredToParameterName@@"] = {key: f"param_{i}" for i, key in enumerate(state)}
    path = str(tmp_path / f"{name}.pdparams")
    paddle.save(state, path)
    images = imagenet_normalise(fixture["crops"])
    ours = paddle_logits(config_for(str(fixture[name + ".arch"]), tmp_path), path, images)
    assert_close(ours, fixture[name + ".logits"])


def test_the_importer_says_what_it_read(torch_models, tmp_path):
    out, _ = torch_models
    config = config_for("resnet50", tmp_path)
    programs = program.build_programs(config, training=False)
    path = str(out / "torchvision_resnet50.pth")
    _, note = program_state(read_tensors(path)[1], None, programs.model, config, path)
    assert "torchvision/timm" in note and "[0.485, 0.456, 0.406]" in note and "as this run" in note
    other = config_for("resnet50", tmp_path, **{"data.normalize_mean": (0.5, 0.5, 0.5)})
    _, note = program_state(read_tensors(path)[1], None, programs.model, other, path)
    assert note.split("; ")[1].startswith("warning")


@pytest.mark.parametrize(
    "extra",
    [
        {"asp.enabled": True, "asp.prune_model": True},
        {"qat.enabled": True, "lr.base": 0.05},
    ],
)
def test_asp_and_qat_start_from_an_imported_file(torch_models, fmnist_root, tmp_path, extra):
    """A torchvision ResNet-18 of 10 classes, pruned (ASP) or quantized (QAT), trained
    one epoch on the demo data from the imported weights."""
    out, _ = torch_models
    path = str(out / "torchvision_resnet18_10_classes.pth")
    config = small_config(
        fmnist_root, tmp_path, **extra, **{"run.epochs": 1, "run.from_pretrained_params": path}
    )
    result = train.run(config, report_stream=open(os.devnull, "w"))
    assert np.isfinite(result["val.loss"])
    records = read_report(config.report_file)
    pretrained = next(r for r in records if r["step"] == "PRETRAINED")
    assert pretrained["data"]["file"] == path and pretrained["data"]["skipped"] == []
    _, state = ckpt.read_checkpoint(os.path.join(str(tmp_path), "resnet18"))
    if config.qat.enabled:
        assert any(name.endswith("@scale") for name in state)
    else:  # the imported first convolution of layer1, pruned to 2:4
        assert holds(state["conv2d_1.w_0"], NVIDIA_2_4)


def imported(path, arch, tmp_path):
    config = config_for(arch, tmp_path)
    programs = program.build_programs(config, training=False)
    return program_state(read_tensors(path)[1], None, programs.model, config, path)


def test_another_architecture_names_the_file_and_first_tensor(torch_models, tmp_path):
    out, _ = torch_models
    path = str(out / "torchvision_resnet18.pth")
    with pytest.raises(
        CheckpointError,
        match=r"torchvision_resnet18\.pth: a torchvision/timm "
        r"file that does not fit resnet50: layer1\.0\.conv1\.weight has shape",
    ):
        imported(path, "resnet50", tmp_path)


def test_a_v1_5_file_into_a_v1_model_is_refused(torch_models, tmp_path):
    with pytest.raises(
        CheckpointError, match=r"holds a ResNet v1\.5 .* resnet50_v1 is a ResNet v1"
    ):
        imported(str(torch_models[0] / "torchvision_resnet50.pth"), "resnet50_v1", tmp_path)


def test_a_v1_checkpoint_into_a_v1_5_model_is_refused(fmnist_root, tmp_path):
    v1 = small_config(fmnist_root, tmp_path, **{"model.arch": "resnet50_v1"})
    programs = program.build_programs(v1, training=False)
    paddle.static.Executor(paddle.CPUPlace()).run(programs.startup)
    folder = str(tmp_path / "v1")
    ckpt.save_checkpoint(programs.eval, folder, {"config": v1.to_dict()})
    v15 = small_config(
        fmnist_root,
        tmp_path,
        **{
            "model.arch": "resnet50",
            "run.from_pretrained_params": os.path.join(folder, "model.pdparams"),
        },
    )
    meta, state = read_weights(v15.run)
    with pytest.raises(
        CheckpointError,
        match=r"model\.pdparams: holds a ResNet v1 \(trained as "
        r"resnet50_v1\); resnet50 is a ResNet v1\.5",
    ):
        program_state(
            state,
            meta,
            program.build_programs(v15, training=False).model,
            v15,
            v15.run.from_pretrained_params,
        )


def test_a_truncated_pth_is_one_clear_error(torch_models, tmp_path):
    whole = (torch_models[0] / "torchvision_resnet18.pth").read_bytes()
    path = tmp_path / "cut.pth"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.pth: cannot be read as a PyTorch file"):
        read_tensors(str(path))


def test_an_unknown_naming_names_the_file_and_a_tensor(tmp_path):
    path = str(tmp_path / "detectron.pth")
    torch.save({"backbone.res2.0.conv1.weight": torch.zeros(64, 64, 1, 1)}, path)
    with pytest.raises(
        CheckpointError,
        match=r"detectron\.pth: unknown naming: tensor "
        r"'backbone\.res2\.0\.conv1\.weight'",
    ):
        imported(path, "resnet18", tmp_path)


def test_a_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="nothing.pth does not exist"):
        read_tensors(str(tmp_path / "nothing.pth"))


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "notes.pth",
            b"these are not weights\n",
            r"notes\.pth: not a weights file \(neither "
            r"PyTorch, safetensors nor a Paddle pickle",
        ),
        ("empty.safetensors", b"", r"empty\.safetensors: is empty, not a weights file"),
        ("empty.pth", b"", r"empty\.pth: is empty, not a weights file"),
    ],
)
def test_a_text_or_empty_file_is_named_as_no_weights_file(tmp_path, name, content, message):
    """Named as what it is, not as "<file>.pdparams does not exist"."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        read_tensors(str(path))
