"""Compressed KV cache inside ``model.generate``: budgets, policies, kernels."""

from .attention import headprobe_attention
from .budgets import BudgetSource, MapBudget, RatioBudget, UniformBudget, distribute
from .cache import CompressedCache
from .generate import GenerationResult, generate_compressed, make_policy
from .policies import POLICIES, Policy

__all__ = ["BudgetSource", "CompressedCache", "GenerationResult", "MapBudget", "POLICIES", "Policy",
           "RatioBudget", "UniformBudget", "distribute", "generate_compressed", "headprobe_attention",
           "make_policy"]

from .kernels.dispatch import set_backend as set_kernel_backend  # noqa: E402

__all__ += ["set_kernel_backend"]
