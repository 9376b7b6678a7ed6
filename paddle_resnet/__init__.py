"""paddle-resnet: ResNet-family classifiers with Paddle static graphs, DALI and Fleet.

Importing the package does nothing but import: each command prepares its process as its
first step (``core/bootstrap.prepare_process``: the environment Paddle reads at import,
then Paddle with its chatter hidden; the training command starts itself again with
tcmalloc before that). See docs/architecture.md for the layers and the import rule.
"""
