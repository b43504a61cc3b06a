"""KV-cache budget allocation: turn profiles into per (layer, KV head) token budgets.

Allocators (one module each, each defining its options dataclass and its ``ALLOCATOR``): :mod:`.headkv`
(HeadKV, with ``compat="headkv"``), :mod:`.dynamickv_offline`, :mod:`.combined` (DynamicKV layer budgets
split by head scores), :mod:`.uniform` (SnapKV), :mod:`.pyramid` (PyramidKV); :data:`ALLOCATORS` names them
with what each reads and its options, and :func:`allocate` runs one by name. The integer arithmetic they share
with the runtime (exact splits, clamping to a prompt) is :mod:`headprobe.budget_arithmetic`.
"""

from .allocator import Allocator
from .api import (
    METHODS,
    FoundProfile,
    allocate,
    find_profiles,
    load_profile,
    newest_profile,
    profile_search_dirs,
    profiles_for_method,
    summarize,
)
from .clamp import clamp_for_model
from .combined import CombinedOptions, allocate_combined, split_layer_pools
from .common import Capacity, prepare_scores, resolve_capacity
from .dynamickv_offline import DynamicKVOptions, allocate_dynamickv, parse_task_mix, retention_shares
from .headkv import (
    DEFAULT_BETA,
    HeadKVOptions,
    allocate_headkv,
    headkv_budgets,
    headkv_compat_budgets,
    headkv_floor,
)
from .options import AllocatorOptions, CapacityOptions
from .pyramid import DEFAULT_TAPER, PyramidOptions, allocate_pyramid, pyramid_layer_weights
from .registry import ALLOCATORS
from .uniform import allocate_uniform

__all__ = [
    "ALLOCATORS",
    "DEFAULT_BETA",
    "DEFAULT_TAPER",
    "METHODS",
    "Allocator",
    "AllocatorOptions",
    "Capacity",
    "CapacityOptions",
    "CombinedOptions",
    "DynamicKVOptions",
    "FoundProfile",
    "HeadKVOptions",
    "PyramidOptions",
    "allocate",
    "allocate_combined",
    "allocate_dynamickv",
    "allocate_headkv",
    "allocate_pyramid",
    "allocate_uniform",
    "clamp_for_model",
    "find_profiles",
    "headkv_budgets",
    "headkv_compat_budgets",
    "headkv_floor",
    "load_profile",
    "newest_profile",
    "parse_task_mix",
    "prepare_scores",
    "profile_search_dirs",
    "profiles_for_method",
    "pyramid_layer_weights",
    "resolve_capacity",
    "retention_shares",
    "split_layer_pools",
    "summarize",
]
