"""The model registry: every architecture by name, built from the ``model`` config section.

    model = build_model(config.model)      # config.model.arch == "resnet50"

The table at the end names every member of the ResNet family this toolkit trains. A
name maps to a network class and its description; another network module registers
its class with its own description (``register_model(name, arch, network=MyNet)``),
built with the same keyword arguments as ``ResNet``.
"""

from typing import Dict, Tuple

from paddle_resnet.core.errors import ConfigError
from paddle_resnet.models.resnet import Arch, ResNet

_REGISTRY: Dict[str, Tuple[type, Arch]] = {}


def register_model(name: str, arch: Arch, network: type = ResNet) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is registered twice")
    _REGISTRY[name] = (network, arch)


def list_models():
    return sorted(_REGISTRY)


def _registered(name: str) -> Tuple[type, Arch]:
    try:
        # NVIDIA's reference names its model ResNet50
        return _REGISTRY[name] if name in _REGISTRY else _REGISTRY[name.lower()]
    except KeyError:
        raise ConfigError(
            f"unknown model.arch {name!r}; known: {', '.join(list_models())}"
        ) from None


def get_arch(name: str) -> Arch:
    return _registered(name)[1]


def build_model(model_config):
    """Build the network named by ``model_config.arch`` (a paddle.nn.Layer)."""
    network, arch = _registered(model_config.arch)
    return network(
        arch,
        num_classes=model_config.num_classes,
        data_format=model_config.data_layout,
        zero_init_residual=model_config.zero_init_residual,
        in_channels=model_config.image_channels,
    )


_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}

for _depth, (_block, _layers) in _DEPTHS.items():
    # v1.5 is the default name, as in the NVIDIA and torchvision model zoos.
    register_model(f"resnet{_depth}", Arch(_block, _layers))
    if _block == "bottleneck":
        register_model(f"resnet{_depth}_v1", Arch(_block, _layers, stride_in_1x1=True))

register_model("resnext50_32x4d", Arch("bottleneck", (3, 4, 6, 3), groups=32, width_per_group=4))
register_model("resnext101_32x4d", Arch("bottleneck", (3, 4, 23, 3), groups=32, width_per_group=4))
register_model("resnext101_32x8d", Arch("bottleneck", (3, 4, 23, 3), groups=32, width_per_group=8))
