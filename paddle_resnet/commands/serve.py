"""Serve an exported model over the Open Inference Protocol (KServe v2), REST and gRPC.

paddle-resnet-serve's front door; what it runs is ``deploy/serve.py``."""

import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import main_with


def main(argv=None):
    bootstrap.prepare_process(argv)
    from paddle_resnet.deploy import serve

    return main_with("serve", __doc__.splitlines()[0], serve.run, argv, REGISTRY_CHOICES)


if __name__ == "__main__":
    sys.exit(main())
