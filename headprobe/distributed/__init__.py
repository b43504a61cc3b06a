"""Data-parallel profiling, evaluation and ablation over the ranks of a ``torchrun`` launch.

Each rank runs a slice of the work and logs it in its own file; rank 0 gathers the slices over
torch.distributed and writes the outputs a single process writes. See ``docs/scale.md``.
"""
