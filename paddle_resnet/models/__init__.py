"""Models by family. Every module of this folder is imported here, so that each family's
registration has run before anyone asks the registry: a new family is one new module,
listed nowhere.
"""

import importlib
import pkgutil

from paddle_resnet.models.registry import build_model, list_models, model_entry, register_model

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["build_model", "list_models", "model_entry", "register_model"]
