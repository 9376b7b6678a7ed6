import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest

from conftest import ROOT
from paddle_resnet.core.config import ModelConfig, build_config
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.models import build_model, list_models, model_entry, registry
from paddle_resnet.training import ir
from paddle_resnet.training import programs as program
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX


@pytest.fixture(autouse=True)
def dygraph():
    paddle.disable_static()
    yield
    paddle.enable_static()


def trainable_parameters(model):
    return sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)


@pytest.mark.parametrize(
    "arch, published",
    [
        ("resnet18", 11_689_512),
        ("resnet50", 25_557_032),
        ("resnext101_32x4d", 44_177_704),
    ],
)
def test_parameter_counts_match_published(arch, published):
    assert trainable_parameters(build_model(ModelConfig(arch=arch))) == published


def test_registry_lists_family_and_rejects_unknown_names():
    names = list_models()
    for depth in (18, 34, 50, 101, 152):
        assert f"resnet{depth}" in names
    assert "resnet50_v1" in names and "resnext101_32x4d" in names
    with pytest.raises(ConfigError, match="unknown model.arch 'resnet51'"):
        model_entry("resnet51")


@pytest.mark.parametrize("arch", ["resnet18", "resnet50", "resnext50_32x4d"])
def test_output_shape(arch):
    model = build_model(ModelConfig(arch=arch, num_classes=7))
    model.eval()
    out = model(paddle.randn([2, 3, 64, 64]))
    assert out.shape == [2, 7]


def test_v1_strides_in_first_1x1_and_v15_in_3x3():
    v15 = build_model(ModelConfig(arch="resnet50"))
    v1 = build_model(ModelConfig(arch="resnet50_v1"))
    first = 0
    for stage in ("layer2", "layer3", "layer4"):
        block15, block1 = getattr(v15, stage)[first], getattr(v1, stage)[first]
        assert block15.conv1._stride == [1, 1] and block15.conv2._stride == [2, 2]
        assert block1.conv1._stride == [2, 2] and block1.conv2._stride == [1, 1]
    assert trainable_parameters(v1) == trainable_parameters(v15)


def test_resnext_uses_grouped_3x3():
    model = build_model(ModelConfig(arch="resnext101_32x4d"))
    conv = model.layer1[0].conv2
    assert conv._groups == 32 and conv.weight.shape == [128, 4, 3, 3]


def test_zero_init_residual_zeroes_last_bn_gamma_only():
    model = build_model(ModelConfig(arch="resnet50", zero_init_residual=True))
    block = model.layer1[0]
    assert float(block.bn3.weight.abs().sum()) == 0.0
    assert float(block.bn1.weight.abs().sum()) > 0.0


def test_nhwc_equals_nchw_for_the_same_weights():
    paddle.seed(3)
    nchw = build_model(ModelConfig(arch="resnet18", num_classes=10))
    nhwc = build_model(ModelConfig(arch="resnet18", num_classes=10, data_layout="NHWC"))
    nhwc.set_state_dict(nchw.state_dict())
    nchw.eval()
    nhwc.eval()
    image = paddle.randn([2, 3, 48, 48])
    expected = nchw(image).numpy()
    actual = nhwc(paddle.transpose(image, [0, 2, 3, 1])).numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


TINY_FAMILY = os.path.join(ROOT, "tests", "fixtures", "tiny_family.py")


def test_a_family_is_one_module_in_models(tmp_path):
    """docs/architecture.md, a new model family: one module in models/, listed nowhere.
    A copy of the package with the fixture's family module dropped into its models/ (the
    registry untouched: the package finds the module itself) runs program.py on the new
    member, its programs built with 2:4 sparsity; here the member is unknown."""
    copy = tmp_path / "package"
    shutil.copytree(
        os.path.join(ROOT, "paddle_resnet"),
        copy / "paddle_resnet",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(TINY_FAMILY, copy / "paddle_resnet" / "models")
    described = tmp_path / "programs.json"
    result = subprocess.run(
        [sys.executable, "-m", "paddle_resnet.commands.program", "--model-arch-name"]
        + ["tiny_convnet", "--num-of-class", "10", "--crop-size", "32", "--resize-short", "32"]
        + ["--asp", "--json", str(described)],
        cwd=copy,
        env=dict(os.environ, PYTHONPATH=str(copy)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with open(described) as handle:
        description = json.load(handle)
    # the fixture's network: 3x3 convolutions 3->8->16 and a 16->10 classifier, with biases
    assert description["eval"]["parameters"] == (3 * 9 + 1) * 8 + (8 * 9 + 1) * 16 + 17 * 10
    assert description["strategies"]["ASP"]
    assert "tiny_convnet" not in list_models()


@pytest.fixture
def tiny_family(monkeypatch):
    """The fixture's family registered for one test, as its module registers it when the
    package imports it (its discovery: ``test_a_family_is_one_module_in_models``)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    spec = importlib.util.spec_from_file_location("tiny_family", TINY_FAMILY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_config(**values):
    base = {
        "model.arch": "tiny_convnet",
        "model.num_classes": 10,
        "data.image_root": "x",
        "data.crop_size": 32,
        "data.resize_short": 32,
        "run.epochs": 10,
    }
    return build_config(dict(base, **values))


def test_a_registered_family_builds_its_programs(tiny_family):
    """docs/architecture.md, a new model family: its module and nothing else. The
    programs are built through the registry; 2:4 sparsity keeps the family's classifier
    (``head``, not ResNet's ``fc``) dense."""
    paddle.enable_static()
    programs = program.build_programs(
        tiny_config(**{"asp.enabled": True}), steps_per_epoch=2, global_batch=16
    )
    assert isinstance(programs.model, tiny_family.TinyConvNet)
    assert tuple(programs.model.conv1.weight.shape) == (8, 3, 3, 3)
    masked = {
        name[: -len(MASK_SUFFIX)]
        for name in ir.persistable_names(programs.train)
        if name.endswith(MASK_SUFFIX)
    }
    model = programs.model
    assert masked == {model.conv1.weight.name, model.conv2.weight.name}
    classifier = tiny_family.TINY.classifier_parameters(model)
    assert classifier == (model.head.weight.name, model.head.bias.name)


@pytest.mark.parametrize(
    "values, refusal",
    [
        ({"model.zero_init_residual": True}, "tiny_convnet \\(TinyConvNet\\) has none"),
        ({"model.data_layout": "NHWC"}, "tiny_convnet takes NCHW input"),
    ],
)
def test_what_a_family_does_not_take_is_refused(tiny_family, values, refusal):
    with pytest.raises(ConfigError, match=refusal):
        build_model(tiny_config(**values).model)
