"""N:M structured sparsity; --asp prunes to NVIDIA's 2:4 (ASP).

- ``pattern``: the N:M arithmetic on NumPy arrays (no Paddle), and the record of which
  pattern which weights hold.
- ``masks``: pruning and per-epoch verification of a training program.
The checker command is ``python -m paddle_resnet.commands.check_sparsity PATH``.
"""
