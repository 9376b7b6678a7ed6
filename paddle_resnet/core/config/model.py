"""The model section: the architecture and its input."""

from dataclasses import dataclass

from paddle_resnet.core.config.keys import DATA_LAYOUTS, TRAIN_EXPORT, at_least, key


@dataclass(frozen=True)
class ModelConfig:
    arch: str = key(
        "resnet50",
        "--model-arch-name",
        "registered architecture, e.g. resnet50, resnext101_32x4d",
        tools=TRAIN_EXPORT,
    )
    num_classes: int = key(
        1000,
        "--num-of-class",
        "number of classes (must match the data)",
        at_least(2),
        tools=TRAIN_EXPORT,
    )
    data_layout: str = key(
        "NCHW", "--data-layout", "tensor layout", choices=DATA_LAYOUTS, tools=TRAIN_EXPORT
    )
    image_channels: int = key(
        3,
        "--image-channels",
        "input channels: 3 (RGB), or 4 (RGB and a zero channel padded by DALI, so NHWC fp16 "
        "convolutions get tensor-core friendly shapes; --image-shape 4,224,224)",
        choices=(3, 4),
        tools=TRAIN_EXPORT,
    )
    zero_init_residual: bool = key(
        False, "--zero-init-residual", "zero gamma in each block's last BN", tools=TRAIN_EXPORT
    )
