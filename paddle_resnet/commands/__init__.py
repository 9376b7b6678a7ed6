"""What each command-line tool does, as functions: ``run(config)`` and ``main(argv)``.
The top-level train.py, export_model.py and inference.py only call ``main``.

``REGISTRY_CHOICES``: the config keys whose values a registry above ``core/`` holds,
which every tool's command line and the flag table (docs/flags.md) offer. It lives here, the
first floor that sees both registries (``core/config/`` cannot import them)."""

from paddle_resnet.data import records
from paddle_resnet.deploy import backends

REGISTRY_CHOICES = {"data.format": records.DATA_FORMATS, "inference.backend": backends.CHOICES}
