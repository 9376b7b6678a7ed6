"""N:M structured sparsity; --asp prunes to NVIDIA's 2:4 (ASP): ``pattern``, the N:M
arithmetic on NumPy arrays; ``masks``, pruning and verification of a training program."""
