"""Combined allocation: DynamicKV's per-layer budgets, split across each layer's KV heads by head scores.

Neither paper does this. Each layer's pool (from a layer-retention profile) is shared inside the layer
the HeadKV way: a ``1 − 1/β`` part evenly, the ``1/β`` part by the heads' normalised scores within
the layer, with exact integer rounding per layer. Every head also keeps the window and the sink.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..budget_arithmetic import largest_remainder
from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from ..profile import Profile, kv_head_scores
from .allocator import Allocator, Source
from .clamp import clamp_for_model
from .common import (
    build_budget_map,
    check_beta,
    check_profile_model,
    method_block,
    prepare_scores,
    resolve_capacity,
    source_entry,
)
from .dynamickv_offline import layer_pools, retention_shares, task_mix, task_option
from .headkv import DEFAULT_BETA, HeadScoreOptions
from .options import CapacityOptions


@dataclass(frozen=True)
class CombinedOptions(HeadScoreOptions):
    """The combined allocation's options: the head-score split's (β inside each layer) and DynamicKV's task."""

    task: str | Mapping[str, float] | None = task_option()

    def check(self) -> None:
        super().check()
        task_mix(self.task)


def split_layer_pools(pools: np.ndarray, scores: np.ndarray, beta: float) -> np.ndarray:
    """Split each layer's pool over its heads.

    Parameters
    ----------
    pools
        ``[layers]`` integer tokens per layer.
    scores
        ``[layers][heads]`` non-negative weights (any scale; only the within-layer ratios matter).
    beta
        β > 1: ``1/β`` of each layer's pool follows the scores, the rest is even.

    Returns
    -------
    np.ndarray
        ``int64 [layers][heads]`` whose rows sum exactly to ``pools``.
    """
    s = np.asarray(scores, dtype=np.float64)
    heads = s.shape[1]
    out = np.zeros(s.shape, dtype=np.int64)
    for layer, pool in enumerate(np.asarray(pools, dtype=np.int64)):
        row = s[layer]
        within = row / row.sum() if row.sum() > 0 else np.full(heads, 1.0 / heads)
        weights = (1 - 1 / beta) / heads + within / beta
        out[layer] = largest_remainder(weights, int(pool))
    return out


def allocate_combined(head_profile: Profile, layer_profile: Profile, model: ModelIdentity | None = None, *,
                      capacity: int | None = 128, window: int = 8, sink: int = 0, beta: float = DEFAULT_BETA,
                      ratio: float | None = None, prompt_len: int | None = None,
                      task: str | Mapping[str, float] | None = None, temperature: float | None = None,
                      reduction: str | None = None, clamp: bool = False, allow_fallback: bool = False,
                      source_paths: Sequence[str | None] = (None, None)) -> BudgetMap:
    """Budget map from a head-score profile and a layer-retention profile of the same model."""
    model = check_profile_model(head_profile, model)
    check_profile_model(layer_profile, model)
    beta = check_beta(beta)
    cap = resolve_capacity(capacity, window, sink, ratio, prompt_len)
    if head_profile.query_heads is None:
        raise HeadprobeError("combined allocation needs a head-score profile first, then a layer-retention one")
    weights, fell_back = prepare_scores(kv_head_scores(head_profile, reduction), temperature, allow_fallback,
                                        what=f"{head_profile.kind} profile of {head_profile.model.name}")
    shares, mix = retention_shares(layer_profile, task)
    pools = layer_pools(shares, cap.base, model.num_kv_heads)
    budgets = split_layer_pools(pools, weights, beta) + cap.window + cap.sink
    if clamp:
        budgets = clamp_for_model(budgets, cap, prompt_len, model)
    method = method_block(
        "combined", cap, beta=beta, temperature=temperature, reduction=reduction or head_profile.group_reduction,
        task=mix, floor=cap.window + cap.sink, clamped_to=prompt_len if clamp else None,
        fallback="uniform" if fell_back else None,
        sources=[source_entry(head_profile, source_paths[0]), source_entry(layer_profile, source_paths[1])])
    return build_budget_map(model, budgets, method)


def _run(model: ModelIdentity, sources: Sequence[Source], capacity: CapacityOptions,
         options: CombinedOptions) -> BudgetMap:
    (heads, heads_path), (layers, layers_path) = sources
    return allocate_combined(heads, layers, model, **{**options.as_dict(), "task": task_mix(options.task)},
                             source_paths=(heads_path, layers_path), **capacity.as_dict())


ALLOCATOR = Allocator("combined", ("head_scores", "layer_retention"), "DynamicKV layer budgets split inside each "
                      "layer by head scores (beta as in headkv)", CombinedOptions, _run)

__all__: Sequence[str] = ("ALLOCATOR", "CombinedOptions", "allocate_combined", "split_layer_pools")
