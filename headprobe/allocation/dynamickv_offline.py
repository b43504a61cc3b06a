"""DynamicKV layer budgets from an offline layer-retention profile.

DynamicKV (Zhou et al.) gives each layer a share of ``B · L`` tokens per head (``B = capacity − window``)
in proportion to how many of the globally top-ranked tokens the layer holds. A layer-retention profile
measures those shares per task type; here they become a static budget map, spread evenly over the KV
heads of each layer, with the window (and sink) added to every head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..budget_arithmetic import largest_remainder
from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from ..profile import Profile
from .allocator import Allocator, Source
from .clamp import clamp_for_model
from .common import (
    build_budget_map,
    check_profile_model,
    method_block,
    resolve_capacity,
    source_entry,
)
from .options import AllocatorOptions, CapacityOptions, option


def parse_task_mix(text: str | None) -> str | dict[str, float] | None:
    """Parse ``"qa"`` or ``"qa:0.5,code:0.5"`` into a task name or a mix; ``None`` stays ``None``."""
    if text is None or ":" not in text and "," not in text:
        return text
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.partition(":")
        try:
            mix[name.strip()] = float(weight) if weight else 1.0
        except ValueError:
            raise HeadprobeError(f"task mix {text!r}: weight {weight!r} of {name!r} is not a number") from None
    return mix


def profile_tasks(profiles: Sequence[Profile]) -> tuple[str | None, ...]:
    """The ``task`` values ``headprobe tune`` tries: the equal mix (``None``), then every task type of the
    layer-retention profile among ``profiles`` (sorted)."""
    tasks = sorted({t for p in profiles for t in (p.retention or {})})
    return (None, *tasks)


def task_option() -> Any:
    """The ``task`` option (``dynamickv``, ``combined``): a task name or a mix, as text or a mapping."""
    return option(None, "layer-retention task, or a mix like qa:0.7,code:0.3 (default: the equal mix of every "
                  "task in the profile)", commas=True, search=profile_tasks)


def task_mix(task: str | Mapping[str, float] | None) -> str | Mapping[str, float] | None:
    """The ``task`` option as :func:`retention_shares` reads it (a mix's text parsed, see :func:`parse_task_mix`)."""
    return parse_task_mix(task) if isinstance(task, str) else task


@dataclass(frozen=True)
class DynamicKVOptions(AllocatorOptions):
    """DynamicKV's options: which task type's layer shares to allocate by."""

    task: str | Mapping[str, float] | None = task_option()

    def check(self) -> None:
        task_mix(self.task)


def retention_shares(profile: Profile, task: str | Mapping[str, float] | None = None) -> tuple[np.ndarray, dict]:
    """Per-layer shares (summing to 1) for one task type or a weighted mix of several.

    Parameters
    ----------
    task
        A task name, a ``{task: weight}`` mix, or ``None`` for the equal mix of every task in the profile.

    Returns
    -------
    shares, mix
        ``[layers]`` float64 summing to 1, and the normalised mix used.
    """
    if not profile.retention:
        raise HeadprobeError(f"{profile.kind} profile of {profile.model.name} has no layer retention "
                             "(make one with `headprobe profile --probe layer_retention`)")
    tasks = profile.retention
    if task is None:
        mix = {name: 1.0 for name in tasks}
    elif isinstance(task, str):
        mix = {task: 1.0}
    else:
        mix = dict(task)
    unknown = [t for t in mix if t not in tasks]
    if unknown:
        raise HeadprobeError(f"task {', '.join(unknown)} is not in the layer-retention profile "
                             f"(it has {', '.join(tasks)})")
    if any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise HeadprobeError("task mix weights must be non-negative with a positive sum")
    total_w = sum(mix.values())
    mix = {k: v / total_w for k, v in mix.items()}
    shares = sum(w * np.asarray(tasks[t].mean, dtype=np.float64) for t, w in mix.items())
    shares = np.asarray(shares, dtype=np.float64)
    if not np.all(np.isfinite(shares)) or np.any(shares < 0) or shares.sum() <= 0:
        raise HeadprobeError("layer retention has NaN, negative or all-zero shares: nothing to allocate by")
    return shares / shares.sum(), mix


def layer_pools(shares: np.ndarray, base: int, kv_heads: int) -> np.ndarray:
    """Tokens beyond the window per layer: ``B · L · H_kv`` split by ``shares`` exactly (``int64 [layers]``)."""
    return largest_remainder(shares, base * len(shares) * kv_heads)


def spread_evenly(layer_totals: np.ndarray, heads: int) -> np.ndarray:
    """``[layers] → [layers][heads]``: each layer's total split evenly, the remainder to the lowest heads."""
    t = np.asarray(layer_totals, dtype=np.int64)
    out = np.repeat((t // heads)[:, None], heads, axis=1)
    rem = t % heads
    out += (np.arange(heads)[None, :] < rem[:, None]).astype(np.int64)
    return out


def allocate_dynamickv(profile: Profile, model: ModelIdentity | None = None, *, capacity: int | None = 128,
                       window: int = 8, sink: int = 0, ratio: float | None = None, prompt_len: int | None = None,
                       task: str | Mapping[str, float] | None = None, clamp: bool = False,
                       source_path: str | None = None) -> BudgetMap:
    """DynamicKV budget map: per-layer budgets from retention shares, even over each layer's KV heads.

    The non-window budgets sum to ``B · L`` per KV head (``B = capacity − window − sink``), i.e. to
    ``B · L · H_kv`` in all, split over layers by the retention shares with largest-remainder rounding;
    every head also keeps ``window + sink``.
    """
    model = check_profile_model(profile, model)
    cap = resolve_capacity(capacity, window, sink, ratio, prompt_len)
    shares, mix = retention_shares(profile, task)
    pools = layer_pools(shares, cap.base, model.num_kv_heads)
    budgets = spread_evenly(pools, model.num_kv_heads) + cap.window + cap.sink
    if clamp:
        budgets = clamp_for_model(budgets, cap, prompt_len, model)
    method = method_block("dynamickv", cap, task=mix, sources=[source_entry(profile, source_path)],
                          floor=cap.window + cap.sink, clamped_to=prompt_len if clamp else None)
    return build_budget_map(model, budgets, method)


def _run(model: ModelIdentity, sources: Sequence[Source], capacity: CapacityOptions,
         options: DynamicKVOptions) -> BudgetMap:
    (profile, path), = sources
    return allocate_dynamickv(profile, model, task=task_mix(options.task), source_path=path, **capacity.as_dict())


ALLOCATOR = Allocator("dynamickv", ("layer_retention",), "DynamicKV offline: layer budgets by layer retention "
                      "(task mix), even over each layer's KV heads", DynamicKVOptions, _run)

__all__: Sequence[str] = ("ALLOCATOR", "DynamicKVOptions", "allocate_dynamickv", "layer_pools", "parse_task_mix",
                          "retention_shares", "spread_evenly", "task_mix", "task_option")
