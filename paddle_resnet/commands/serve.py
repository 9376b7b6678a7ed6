"""paddle-resnet-serve: an exported model over the Open Inference Protocol (KServe v2),
REST and gRPC (``deploy/serve.py``)."""

import sys

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core.cli import main_with
from paddle_resnet.deploy import serve


def main(argv=None):
    return main_with("serve", serve.__doc__.splitlines()[0], serve.run, argv, REGISTRY_CHOICES)


if __name__ == "__main__":
    sys.exit(main())
