"""One mapping table per source of pretrained weights.

This toolkit's ResNet names its tensors as torchvision does, in Paddle's words
(``model.state_dict()``: ``layer1.0.conv2.weight``, ``layer1.0.bn2._mean``,
``layer1.0.downsample.conv.weight``, ``fc.weight``). A ``Source`` says how each of
these is called in another framework's files, which of them are stored transposed,
and what the source's models expect of their input. A file's naming is recognised by
which source names the most of its tensors.
"""

import re
from dataclasses import dataclass
from typing import Callable, Tuple

from paddle_resnet.models.resnet import Arch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# layer{stage}.{block}.{unit}.{leaf}: a tensor inside a residual block
_BLOCK = re.compile(
    r"layer(?P<stage>\d)\.(?P<block>\d+)\."
    r"(?P<unit>conv\d|bn\d|downsample\.conv|downsample\.bn)\.(?P<leaf>\w+)"
)


@dataclass(frozen=True)
class Source:
    name: str
    rename: Callable[[str, Arch], str]  # our structured name -> the file's name
    transposed: Tuple[str, ...] = ()  # our names whose matrices the file stores [out, in]
    ignored: Tuple[str, ...] = ()  # suffixes of file tensors with no counterpart
    # What the source's models expect: RGB in [0, 1], then (x - mean) / std.
    mean: Tuple[float, float, float] = IMAGENET_MEAN
    std: Tuple[float, float, float] = IMAGENET_STD
    layouts: str = "v1.5"  # its ResNets stride in the 3x3 convolution


def _block(ours):
    """(stage, block, unit, leaf) of a tensor inside a residual block, or None."""
    match = _BLOCK.fullmatch(ours)
    if match is None:
        return None
    return (int(match["stage"]), int(match["block"]), match["unit"], match["leaf"])


def _flat_index(arch, stage, block):
    """The block's position in a single list of all blocks (PaddleClas numbers them so)."""
    return sum(arch.layers[: stage - 1]) + block


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
    parts = _block(ours)
    if parts is None:
        return ours  # fc.weight, fc.bias
    stage, block, unit, leaf = parts
    kind = "bn" if "bn" in unit else "conv"
    unit = "short" if unit.startswith("downsample") else f"conv{int(unit[-1]) - 1}"
    return f"blocks.{_flat_index(arch, stage, block)}.{unit}.{kind}.{leaf}"


def _paddleclas_resnext(ours, arch):
    # ppcls/arch/backbone/model_zoo/resnext.py: bb_{stage}_{block}, _conv/_batch_norm, "out".
    kinds = {"conv": "_conv", "bn": "_batch_norm"}
    if ours.startswith(("conv1.", "bn1.")):
        layer, leaf = ours.split(".", 1)
        return f"conv.{kinds[layer[:-1]]}.{leaf}"
    if ours.startswith("fc."):
        return "out." + ours[3:]
    stage, block, unit, leaf = _block(ours)
    kind = kinds["bn" if "bn" in unit else "conv"]
    unit = "short" if unit.startswith("downsample") else f"conv{int(unit[-1]) - 1}"
    return f"bb_{stage - 1}_{block}.{unit}.{kind}.{leaf}"


TORCHVISION = Source(
    "torchvision/timm", _torchvision, transposed=("fc.weight",), ignored=("num_batches_tracked",)
)
PADDLECLAS_RESNET = Source("PaddleClas ResNet (legendary models)", _paddleclas_resnet)
PADDLECLAS_RESNEXT = Source("PaddleClas ResNeXt (model zoo)", _paddleclas_resnext)
SOURCES = (TORCHVISION, PADDLECLAS_RESNET, PADDLECLAS_RESNEXT)
