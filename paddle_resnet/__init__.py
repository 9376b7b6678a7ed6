"""paddle-resnet: ResNet-family classifiers with Paddle static graphs, DALI and Fleet.

Importing the package prepares the process for Paddle (``bootstrap.py``): every
module that imports Paddle lives in this package, so this is the one place where
the environment is set, and it is set before Paddle is loaded. See
docs/architecture.md for the layers and the import rule.
"""
from paddle_resnet.bootstrap import prepare_environment

prepare_environment()
