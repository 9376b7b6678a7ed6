"""Training: the static programs (programs.py), the epoch loop (loop.py, run.py), the
optimiser, checkpoints, start weights, 2:4 sparsity, QAT, data parallelism and the
CPU/GPU tuning of the train program."""
