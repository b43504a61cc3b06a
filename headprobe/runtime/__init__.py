"""Compressed KV cache inside ``model.generate``: budgets, policies, kernels."""

from .budget_sources import BudgetSource, MapBudget, RatioBudget, UniformBudget
from .cache import CompressedCache, headprobe_attention
from .generate import GenerationResult, generate_compressed, make_policy, parse_policy_options
from .kernels.dispatch import set_kernel_backend
from .policies import POLICIES, LayerContext, Policy, Rebalance, ScorerPolicy
from .settings_batch import CacheSetting, SettingGeneration, generate_settings
from .shape import CacheShape
from .shared_prefill import RecordedPrefill, generate_from_prefill, record_prefill

__all__ = [
    "POLICIES",
    "BudgetSource",
    "CacheSetting",
    "CacheShape",
    "CompressedCache",
    "GenerationResult",
    "LayerContext",
    "MapBudget",
    "Policy",
    "RatioBudget",
    "Rebalance",
    "RecordedPrefill",
    "ScorerPolicy",
    "SettingGeneration",
    "UniformBudget",
    "generate_compressed",
    "generate_from_prefill",
    "generate_settings",
    "headprobe_attention",
    "make_policy",
    "parse_policy_options",
    "record_prefill",
    "set_kernel_backend",
]
