"""Compressed KV cache inside ``model.generate``: budgets, policies, kernels."""

from .budget_sources import BudgetSource, MapBudget, RatioBudget, UniformBudget, distribute
from .cache import CompressedCache
from .cache_attention import headprobe_attention
from .generate import GenerationResult, generate_compressed, make_policy, parse_policy_options
from .policies import POLICIES, Policy
from .shared_prefill import RecordedPrefill, generate_from_prefill, record_prefill

__all__ = [
           "POLICIES",
           "BudgetSource",
           "CompressedCache",
           "GenerationResult",
           "MapBudget",
           "Policy",
           "RatioBudget",
           "RecordedPrefill",
           "UniformBudget",
           "distribute",
           "generate_compressed",
           "generate_from_prefill",
           "headprobe_attention",
           "make_policy",
           "parse_policy_options",
           "record_prefill",
]

from .kernels.dispatch import set_backend as set_kernel_backend

__all__ += ["set_kernel_backend"]
