"""2:4 structured sparsity (ASP).

- ``pattern``: the 2:4 arithmetic on NumPy arrays (no Paddle).
- ``masks``: pruning and per-epoch verification of a training program.
The checker command is ``python -m paddle_resnet.commands.check_sparsity PATH``.
"""
