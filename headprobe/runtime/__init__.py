"""Compressed KV cache inside ``model.generate``: budgets, policies, kernels."""
