"""paddle-resnet: ResNet-family classifiers with Paddle static graphs, DALI and Fleet.

Importing the package prepares the process (``bootstrap.py``): the environment that
Paddle reads at import is set, then Paddle is imported with its chatter hidden.
Every module that imports Paddle lives in this package, so this is the one place,
and it runs first. See docs/architecture.md for the layers and the import rule.
"""

import logging

from paddle_resnet.core import bootstrap

# The toolkit's training command (its train.py, console script or module; not another
# script that imports the package) starts itself again with tcmalloc, before Paddle loads.
bootstrap.preload_allocator()

# Pillow before Paddle: Paddle's library exports zlib symbols that Pillow's PNG encoder
# would otherwise bind to, and crash on (SIGSEGV in deflateReset, Pillow 13 / Paddle 2.6).
from PIL import Image  # noqa: E402, F401

bootstrap.set_verbose(bootstrap.is_verbose())
bootstrap.prepare_environment(verbose=bootstrap.verbose())
with bootstrap.paddle_chatter(bootstrap.verbose()):
    import paddle  # noqa: F401  (after the environment is set: it is read at import)
    from paddle.distributed.fleet.utils import log_util
if not bootstrap.verbose():
    log_util.logger.setLevel(logging.ERROR)  # fleet's topology and strategy INFO lines
