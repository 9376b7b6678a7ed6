"""What each command-line tool does, as functions: ``run(config)`` and ``main(argv)``.
The top-level train.py, export_model.py and inference.py only call ``main``.

A tool's module is its process's front door: it imports nothing that loads Paddle, and its
``main`` prepares the process first (``bootstrap.prepare_process``), then imports what it
runs (docs/architecture.md, the import rule).

``registry_choices()``: the config keys whose values a registry above ``core/`` holds,
which every tool's command line and the flag table (docs/flags.md) offer. It lives here, the
first floor that sees both registries (``core/config/`` cannot import them); the registries
load DALI and Paddle, so they are read once the process is prepared."""


def registry_choices():
    from paddle_resnet.data import records
    from paddle_resnet.deploy import backends

    return {"data.format": records.DATA_FORMATS, "inference.backend": backends.CHOICES}
