"""ResNet v1 / v1.5 and ResNeXt, built from ``paddle.nn`` layers.

``paddle.nn`` layers work in Paddle 2.6 static graphs and in the legacy static IR
of Paddle 3.x alike, which ``paddle.static.nn`` does not.
"""

import math
from dataclasses import dataclass
from typing import Tuple

import paddle
from paddle import nn


@dataclass(frozen=True)
class Arch:
    """What distinguishes one member of the ResNet family from another."""

    block: str  # "basic" or "bottleneck"
    layers: Tuple[int, int, int, int]
    groups: int = 1  # ResNeXt cardinality
    width_per_group: int = 64  # ResNeXt bottleneck width
    stride_in_1x1: bool = False  # True: ResNet v1; False: v1.5


def _conv(in_channels, out_channels, kernel, stride=1, groups=1, data_format="NCHW"):
    # He et al. 2015 ("Delving deep into rectifiers"), fan-out mode as in the
    # reference implementations: the variance is kept through the backward pass.
    fan_out = out_channels * kernel * kernel // groups
    return nn.Conv2D(
        in_channels,
        out_channels,
        kernel,
        stride=stride,
        padding=(kernel - 1) // 2,
        groups=groups,
        weight_attr=paddle.ParamAttr(
            initializer=nn.initializer.Normal(std=math.sqrt(2.0 / fan_out))
        ),
        bias_attr=False,
        data_format=data_format,
    )


def _bn(channels, data_format, zero_gamma=False):
    gamma = nn.initializer.Constant(0.0 if zero_gamma else 1.0)
    return nn.BatchNorm2D(
        channels,
        momentum=0.9,
        epsilon=1e-5,
        weight_attr=paddle.ParamAttr(initializer=gamma),
        bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)),
        data_format=data_format,
    )


class _Fusable(nn.Layer):
    """A layer whose batch norms, with the addition and the ReLU after them, train through
    the toolkit's fused CPU kernels where it is given them (``fused``: the loaded
    ``training/cpu_ops``), and through Paddle's layers otherwise: evaluation, batch norms
    on running statistics (frozen stages), SyncBatchNorm."""

    fused = None

    def bn_act(self, bn, x, residual=None, relu=True):
        if self.fused is not None and bn.training and type(bn) is nn.BatchNorm2D:
            return self.fused.bn_act(bn, x, residual, relu)
        y = bn(x)
        if residual is not None:
            # paddle.add, not ``+``: Paddle's static ``+`` calls inspect.stack() on every
            # tensor with a batch dimension (a warning's source line; 55 ms an addition)
            y = paddle.add(y, residual)
        return self.relu(y) if relu else y


class _Downsample(_Fusable):
    def __init__(self, in_channels, out_channels, stride, data_format):
        super().__init__()
        self.conv = _conv(in_channels, out_channels, 1, stride, data_format=data_format)
        self.bn = _bn(out_channels, data_format)

    def forward(self, x):
        return self.bn_act(self.bn, self.conv(x), relu=False)


class _Residual(_Fusable):
    def _shortcut(self, in_channels, out_channels, stride, data_format):
        """The ReLU and the downsampling shortcut, made after the block's other layers."""
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = _Downsample(in_channels, out_channels, stride, data_format)

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.branch(x, shortcut)


class BasicBlock(_Residual):
    expansion = 1

    def __init__(self, in_channels, channels, stride, arch, data_format, zero_init_residual):
        super().__init__()
        if arch.groups != 1 or arch.width_per_group != 64:
            raise ValueError("BasicBlock supports neither groups nor a bottleneck width")
        self.conv1 = _conv(in_channels, channels, 3, stride, data_format=data_format)
        self.bn1 = _bn(channels, data_format)
        self.conv2 = _conv(channels, channels, 3, data_format=data_format)
        self.bn2 = _bn(channels, data_format, zero_gamma=zero_init_residual)
        self._shortcut(in_channels, channels, stride, data_format)

    def branch(self, x, shortcut):
        y = self.bn_act(self.bn1, self.conv1(x))
        return self.bn_act(self.bn2, self.conv2(y), shortcut)


class Bottleneck(_Residual):
    expansion = 4

    def __init__(self, in_channels, channels, stride, arch, data_format, zero_init_residual):
        super().__init__()
        width = int(channels * arch.width_per_group / 64) * arch.groups
        out_channels = channels * self.expansion
        # v1 downsamples in the first 1x1 convolution, v1.5 in the 3x3 one.
        stride_1x1, stride_3x3 = (stride, 1) if arch.stride_in_1x1 else (1, stride)
        self.conv1 = _conv(in_channels, width, 1, stride_1x1, data_format=data_format)
        self.bn1 = _bn(width, data_format)
        self.conv2 = _conv(width, width, 3, stride_3x3, groups=arch.groups, data_format=data_format)
        self.bn2 = _bn(width, data_format)
        self.conv3 = _conv(width, out_channels, 1, data_format=data_format)
        self.bn3 = _bn(out_channels, data_format, zero_gamma=zero_init_residual)
        self._shortcut(in_channels, out_channels, stride, data_format)

    def branch(self, x, shortcut):
        y = self.bn_act(self.bn1, self.conv1(x))
        y = self.bn_act(self.bn2, self.conv2(y))
        return self.bn_act(self.bn3, self.conv3(y), shortcut)


class ResNet(_Fusable):
    """Stem (7x7/2 conv, 3x3/2 max-pool), four stages, global average pool, FC: logits."""

    def __init__(
        self, arch: Arch, num_classes, data_format, zero_init_residual, in_channels, fused=None
    ):
        super().__init__()
        block = {"basic": BasicBlock, "bottleneck": Bottleneck}[arch.block]
        self.conv1 = _conv(in_channels, 64, 7, 2, data_format=data_format)
        self.bn1 = _bn(64, data_format)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2D(3, stride=2, padding=1, data_format=data_format)
        stages = []
        channels_in = 64
        for index, num_blocks in enumerate(arch.layers):
            channels = 64 * 2**index
            blocks = []
            for block_index in range(num_blocks):
                stride = 2 if index > 0 and block_index == 0 else 1
                blocks.append(
                    block(channels_in, channels, stride, arch, data_format, zero_init_residual)
                )
                channels_in = channels * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2D(1, data_format=data_format)
        bound = 1.0 / math.sqrt(channels_in)
        uniform = nn.initializer.Uniform(-bound, bound)
        self.fc = nn.Linear(
            channels_in,
            num_classes,
            weight_attr=paddle.ParamAttr(initializer=uniform),
            bias_attr=paddle.ParamAttr(initializer=uniform),
        )
        if fused is not None:
            for layer in [self, *self.sublayers()]:
                if isinstance(layer, _Fusable):
                    layer.fused = fused

    def forward(self, x):
        x = self.maxpool(self.bn_act(self.bn1, self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = paddle.flatten(self.avgpool(x), start_axis=1)
        return self.fc(x)
