"""Compaction and ragged decode attention: Triton kernels with a PyTorch path of the same results."""
