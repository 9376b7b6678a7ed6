"""ResNet-family models: ``resnet.py`` (the network and its ``Arch`` description) and
``registry.py`` (every architecture by name, with what the toolkit must know of it)."""

from paddle_resnet.models.registry import (
    build_model,
    get_arch,
    list_models,
    model_entry,
    register_model,
)

__all__ = ["build_model", "get_arch", "list_models", "model_entry", "register_model"]
