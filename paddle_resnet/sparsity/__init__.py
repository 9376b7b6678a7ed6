"""2:4 structured sparsity (ASP).

- ``pattern``: the 2:4 arithmetic on NumPy arrays (no Paddle).
- ``training``: pruning and per-epoch verification of a training program (Paddle ASP).
- ``check``: the checker command, ``python -m paddle_resnet.sparsity PATH``.
"""
