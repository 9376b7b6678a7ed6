"""What each command-line tool does, as functions: ``run(config)`` and ``main(argv)``.
A tool's module is its process's front door: it imports nothing that loads Paddle, and its
``main`` prepares the process first (``bootstrap.prepare_process``), then imports what it
runs (docs/architecture.md, the import rule).

``REGISTRY_CHOICES``: the config keys whose values a registry above ``core/`` holds; it
lives here, the first floor that sees both registries."""

import importlib
from collections.abc import Mapping


class _Registries(Mapping):
    """{config key: its values}, read from its registry's module when first asked for: a tool
    imports only the registries it reads (the data formats' imports DALI)."""

    def __init__(self, registries):
        self._registries = registries  # {key: (module, attribute)}

    def __getitem__(self, key):
        module, attribute = self._registries[key]
        return getattr(importlib.import_module(module), attribute)

    def __iter__(self):
        return iter(self._registries)

    def __len__(self):
        return len(self._registries)


REGISTRY_CHOICES = _Registries(
    {
        "data.format": ("paddle_resnet.data.records", "DATA_FORMATS"),
        "inference.backend": ("paddle_resnet.deploy.backends", "CHOICES"),
    }
)
