import numpy as np
import paddle
import pytest

from paddle_resnet.core.config import ModelConfig
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.models import build_model, get_arch, list_models


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
        get_arch("resnet51")


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
