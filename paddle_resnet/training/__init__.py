"""Training: the static programs (programs.py), one run of train.py (run.py) and its
steps (prepare.py, epochs.py, benchmark.py, loop.py), the optimiser, checkpoints,
start weights, 2:4 sparsity, QAT, data parallelism and the CPU/GPU tuning of the
train program."""
