"""The model registry: every architecture by name (``build_model(config.model)``), each
the member's family and its spec (what tells it apart within the family, e.g. ResNet's
``Arch``), registered by its family's module.
"""

import dataclasses
from typing import Any, Dict

from paddle_resnet.core.errors import ConfigError
from paddle_resnet.models.family import ModelFamily


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    family: ModelFamily
    spec: Any = None  # handed to family.build


_REGISTRY: Dict[str, ModelEntry] = {}


def register_model(name: str, family: ModelFamily, spec: Any = None) -> None:
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is registered twice")
    _REGISTRY[name] = ModelEntry(family, spec)


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


def build_model(model_config, fused=None):
    """Build the network named by ``model_config.arch`` (a paddle.nn.Layer); ``fused``: the
    toolkit's fused CPU training kernels (``training/cpu_ops``) for it to train through."""
    entry = model_entry(model_config.arch)
    family = entry.family
    if model_config.data_layout not in family.layouts:
        raise ConfigError(
            f"{model_config.arch} takes {' or '.join(family.layouts)} input, "
            f"not --data-layout {model_config.data_layout}"
        )
    if model_config.zero_init_residual and not family.residual_units:
        raise ConfigError(
            f"--zero-init-residual zeroes the last batch norm of each residual unit; "
            f"{model_config.arch} ({family.name}) has none"
        )
    if family.fused_cpu_training:
        return family.build(entry.spec, model_config, fused)
    return family.build(entry.spec, model_config)
