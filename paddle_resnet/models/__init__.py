"""ResNet-family models: ``resnet.py`` (the network and its ``Arch`` description) and
``registry.py`` (every architecture by name)."""

from paddle_resnet.models.registry import build_model, get_arch, list_models, register_model

__all__ = ["build_model", "get_arch", "list_models", "register_model"]
