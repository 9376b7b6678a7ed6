"""The ResNet family (ResNet v1 / v1.5, ResNeXt): its builder, its facts, how other
frameworks' weight files name its tensors, and every member, by name. Our tensors are
named as torchvision names them, in Paddle's words (``layer1.0.bn2._mean``,
``layer1.0.downsample.conv.weight``).
"""

import re

from paddle_resnet.models.family import ModelFamily, WeightNaming
from paddle_resnet.models.registry import register_model
from paddle_resnet.models.resnet import Arch, ResNet


def _build(arch, model_config, fused=None):
    return ResNet(
        arch,
        num_classes=model_config.num_classes,
        data_format=model_config.data_layout,
        zero_init_residual=model_config.zero_init_residual,
        in_channels=model_config.image_channels,
        fused=fused,
    )


def _variant(arch):
    """v1 strides in a bottleneck's 1x1 convolution, v1.5 in its 3x3 one; basic blocks
    have no 1x1 convolution, so one variant."""
    if arch.block != "bottleneck":
        return None
    return "v1" if arch.stride_in_1x1 else "v1.5"


# layer{stage}.{block}.{unit}.{leaf}: a tensor inside a residual block
_BLOCK = re.compile(
    r"layer(?P<stage>\d)\.(?P<block>\d+)\."
    r"(?P<unit>conv\d|bn\d|downsample\.conv|downsample\.bn)\.(?P<leaf>\w+)"
)


def _paddleclas_block(ours):
    """(stage, block, PaddleClas' unit, kind: conv or bn, leaf) of a block's tensor, or None."""
    match = _BLOCK.fullmatch(ours)
    if match is None:
        return None
    unit = match["unit"]
    short = "short" if unit.startswith("downsample") else f"conv{int(unit[-1]) - 1}"
    kind = "bn" if "bn" in unit else "conv"
    return int(match["stage"]), int(match["block"]), short, kind, match["leaf"]


_TORCH_BN = {"_mean": "running_mean", "_variance": "running_var"}


def _torchvision(ours, arch):
    prefix, leaf = ours.rsplit(".", 1)
    prefix = prefix.replace("downsample.conv", "downsample.0").replace(
        "downsample.bn", "downsample.1"
    )
    return f"{prefix}.{_TORCH_BN.get(leaf, leaf)}"


def _paddleclas_resnet(ours, arch):
    # ppcls/arch/backbone/legendary_models/resnet.py: a stem list, one flat block list,
    # each convolution with its batch norm in a ConvBNLayer (conv0, conv1, [conv2], short).
    if ours.startswith(("conv1.", "bn1.")):
        layer, leaf = ours.split(".", 1)
        return f"stem.0.{'conv' if layer == 'conv1' else 'bn'}.{leaf}"
    parts = _paddleclas_block(ours)
    if parts is None:
        return ours  # fc.weight, fc.bias
    stage, block, unit, kind, leaf = parts
    flat = sum(arch.layers[: stage - 1]) + block  # PaddleClas numbers all blocks in one list
    return f"blocks.{flat}.{unit}.{kind}.{leaf}"


def _paddleclas_resnext(ours, arch):
    # ppcls/arch/backbone/model_zoo/resnext.py: bb_{stage}_{block}, _conv/_batch_norm, "out".
    kinds = {"conv": "_conv", "bn": "_batch_norm"}
    if ours.startswith(("conv1.", "bn1.")):
        layer, leaf = ours.split(".", 1)
        return f"conv.{kinds[layer[:-1]]}.{leaf}"
    if ours.startswith("fc."):
        return "out." + ours[3:]
    stage, block, unit, kind, leaf = _paddleclas_block(ours)
    return f"bb_{stage - 1}_{block}.{unit}.{kinds[kind]}.{leaf}"


# The three sources' ResNets all stride in the 3x3 convolution.
RESNET = ModelFamily(
    "ResNet",
    _build,
    weight_namings=(
        WeightNaming(
            "torchvision/timm",
            _torchvision,
            transposed=("fc.weight",),
            ignored=("num_batches_tracked",),
            variant="v1.5",
        ),
        WeightNaming("PaddleClas ResNet (legendary models)", _paddleclas_resnet, variant="v1.5"),
        WeightNaming("PaddleClas ResNeXt (model zoo)", _paddleclas_resnext, variant="v1.5"),
    ),
    residual_units=True,
    variant=_variant,
    variant_difference="v1 strides in the 1x1 convolution, v1.5 in the 3x3 one",
    stages=(("conv1", "bn1"), ("layer1",), ("layer2",), ("layer3",), ("layer4",)),
    # Measured (training/onednn.py; ResNet-18, 32 px, batch 64, Paddle 2.6.2, 2 cores):
    # oneDNN on conv2d and its gradient, then relu and its gradient, each added speed;
    # batch_norm, pool2d, elementwise_add and sum as well lost most of it.
    onednn_training_ops=("conv2d", "conv2d_grad", "relu", "relu_grad"),
    fused_cpu_training=True,
)

_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}

for _depth, (_kind, _layers) in _DEPTHS.items():
    # v1.5 is the default name, as in the NVIDIA and torchvision model zoos.
    register_model(f"resnet{_depth}", RESNET, Arch(_kind, _layers))
    if _kind == "bottleneck":
        register_model(f"resnet{_depth}_v1", RESNET, Arch(_kind, _layers, stride_in_1x1=True))

# ResNeXt: (blocks per stage, cardinality, width per group)
_RESNEXTS = {
    "resnext50_32x4d": ((3, 4, 6, 3), 32, 4),
    "resnext101_32x4d": ((3, 4, 23, 3), 32, 4),
    "resnext101_32x8d": ((3, 4, 23, 3), 32, 8),
}

for _name, (_layers, _groups, _width) in _RESNEXTS.items():
    register_model(_name, RESNET, Arch("bottleneck", _layers, _groups, _width))
