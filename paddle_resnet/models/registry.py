"""The model registry: every architecture by name, built from the ``model`` config section.

    model = build_model(config.model)      # config.model.arch == "resnet50"

The table at the end names every member of the ResNet family this toolkit trains. A
name maps to an entry: the network class, its description (``Arch``), and what the rest
of the toolkit must know of the model and would otherwise guess: its classifier layer
(replaced when the class count changes), the layers 2:4 sparsity keeps dense, and the
input layouts it takes. Another network module registers its class with its own entry
(``register_model(name, arch, network=MyNet, classifier="head")``), built with the same
keyword arguments as ``ResNet``.
"""

import dataclasses
from typing import Dict, Tuple

from paddle_resnet.core.errors import ConfigError
from paddle_resnet.models.resnet import Arch, ResNet


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    network: type
    arch: Arch
    classifier: str = "fc"  # the layer path of the classifier
    dense_under_sparsity: Tuple[str, ...] = ("fc",)  # layer paths 2:4 pruning leaves dense
    layouts: Tuple[str, ...] = ("NCHW", "NHWC")  # input layouts the network takes

    def classifier_parameters(self, model):
        """The classifier's parameter names in a built ``model``'s programs."""
        return tuple(p.name for p in getattr(model, self.classifier).parameters())

    def classifier_keys(self):
        """The classifier's structured names (``model.state_dict()``): weight and bias."""
        return (f"{self.classifier}.weight", f"{self.classifier}.bias")


_REGISTRY: Dict[str, ModelEntry] = {}


def register_model(name: str, arch: Arch, network: type = ResNet, **facts) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is registered twice")
    _REGISTRY[name] = ModelEntry(network, arch, **facts)


def list_models():
    return sorted(_REGISTRY)


def model_entry(name: str) -> ModelEntry:
    try:
        # NVIDIA's reference names its model ResNet50
        return _REGISTRY[name] if name in _REGISTRY else _REGISTRY[name.lower()]
    except KeyError:
        raise ConfigError(
            f"unknown model.arch {name!r}; known: {', '.join(list_models())}"
        ) from None


def get_arch(name: str) -> Arch:
    return model_entry(name).arch


def build_model(model_config):
    """Build the network named by ``model_config.arch`` (a paddle.nn.Layer)."""
    entry = model_entry(model_config.arch)
    if model_config.data_layout not in entry.layouts:
        raise ConfigError(
            f"{model_config.arch} takes {' or '.join(entry.layouts)} input, "
            f"not --data-layout {model_config.data_layout}"
        )
    return entry.network(
        entry.arch,
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
