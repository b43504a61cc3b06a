"""The layer split as allocation methods: ``layer_split`` (a layer-retention profile) and
``layer_split_heads`` (a head-score profile), both writing a budget map that carries the split.

``headprobe allocate --method layer_split --engine vllm --window 256 --ratio 0.25 --prompt-len 4096`` keeps as
many of the best layers global as a quarter of the full cache at 4,096 tokens allows; ``--global-layers 4``
keeps four. ``--window`` is the local layers' window, ``--sink`` TensorRT-LLM's sink, ``--capacity`` (or
``--ratio``) the mean tokens per KV head at ``--prompt-len``, the context the split is sized at, and
``--cache-bytes 24MiB`` (or ``--cache-share 25%``) the most bytes (share of the full cache) one sequence keeps there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..budget_map import BudgetMap
from ..errors import HeadprobeError, param
from ..layer_split import ENGINES
from ..models.identity import ModelIdentity
from ..sizes import parse_bytes, parse_share
from .allocator import Allocator, Source
from .common import source_entry
from .dynamickv_offline import retention_shares, task_mix, task_option
from .layer_split_choice import (
    LAYER_SCORES,
    SPLIT_POLICY,
    SplitTarget,
    choose_layer_split,
    layer_scores,
    split_budget_map,
)
from .options import AllocatorOptions, CapacityOptions, option, spelled

#: The options that set a split's memory target, one at a time (each overrides the capacity options).
SPLIT_TARGETS = ("global_layers", "cache_bytes", "cache_share")


@dataclass(frozen=True)
class SplitOptions(AllocatorOptions):
    """The options every layer-split method takes first: the engine and the memory target."""

    engine: str = option("vllm", "the serving engine whose per-layer windows the split obeys", choices=ENGINES)
    global_layers: int | None = option(None, "layers kept whole (default: as many as --cache-bytes, --cache-share, "
                                       "--capacity or --ratio allows at --prompt-len)")
    cache_bytes: str | None = option(None, "most bytes of keys and values (bfloat16) one sequence keeps at "
                                     "--prompt-len, e.g. 24MiB")
    cache_share: str | None = option(None, "most share of the full cache kept at --prompt-len, e.g. 25% or 0.25")

    def check(self) -> None:
        """Refuse a negative number of global layers, a size or share that is not one, or two targets at once."""
        given = [n for n in SPLIT_TARGETS if getattr(self, n) is not None]
        if self.global_layers is not None and self.global_layers < 0:
            raise HeadprobeError(f"{spelled('global_layers', self.global_layers)}: expected 0 or more")
        if self.cache_bytes is not None:
            parse_bytes(self.cache_bytes)
        if self.cache_share is not None:
            parse_share(self.cache_share)
        if len(given) > 1:
            raise HeadprobeError(f"{spelled(given[1], getattr(self, given[1]))}: give one target, not it and "
                                 f"{spelled(given[0])}")


@dataclass(frozen=True)
class LayerSplitOptions(SplitOptions):
    """``layer_split``'s options: the engine, the number of global layers, the retention task."""

    task: str | Mapping[str, float] | None = task_option()

    def check(self) -> None:
        super().check()
        task_mix(self.task)


@dataclass(frozen=True)
class LayerSplitHeadsOptions(SplitOptions):
    """``layer_split_heads``'s options: the engine, the number of global layers, how head scores make a layer's."""

    layer_score: str = option("sum", "a layer's score from its KV-head scores", choices=LAYER_SCORES)


def split_target(model: ModelIdentity, capacity: CapacityOptions, options: AllocatorOptions) -> SplitTarget:
    """The context and memory target: the options' ``global_layers``, ``cache_bytes`` (``"24MiB"``) or
    ``cache_share`` (``"25%"``), else the capacity options (``prompt_len`` is the context; default the
    model's own context length).

    Raises
    ------
    HeadprobeError
        No context length, or neither a capacity, a ratio, a size nor a number of global layers.
    """
    n = capacity.prompt_len or model.max_context
    if n is None:
        raise HeadprobeError(f"a layer split is sized at a context length: pass {param('prompt_len')}")
    if options.global_layers is not None:
        return SplitTarget(context=n, global_layers=options.global_layers)
    if options.cache_bytes is not None:
        return SplitTarget(context=n, bytes=parse_bytes(options.cache_bytes))
    if options.cache_share is not None:
        return SplitTarget(context=n, share=parse_share(options.cache_share))
    cap = round(capacity.ratio * n) if capacity.ratio is not None else capacity.capacity
    if cap is None or cap < 1:
        raise HeadprobeError(f"{param('capacity')}: expected tokens per KV head at {param('prompt_len', n)}, or a "
                             f"{param('ratio')} of the full cache")
    return SplitTarget(context=n, capacity=int(cap))


def split_targets(options: AllocatorOptions) -> dict[str, int | str | None]:
    """The target options as the budget map records them."""
    return {n: getattr(options, n) for n in SPLIT_TARGETS}


def _run(name: str, model: ModelIdentity, sources: Sequence[Source], capacity: CapacityOptions,
         options: AllocatorOptions, scores, recorded: dict) -> BudgetMap:
    profile, path = sources[0]
    entry = source_entry(profile, path)
    split = choose_layer_split(model, scores, engine=options.engine, window=capacity.window, sink=capacity.sink,
                               target=split_target(model, capacity, options), source={"profile": entry})
    return split_budget_map(split, name, **split_targets(options), **recorded)


def run_retention(model, sources, capacity, options: LayerSplitOptions) -> BudgetMap:
    shares, mix = retention_shares(sources[0][0], task_mix(options.task))
    return _run("layer_split", model, sources, capacity, options, shares, {"task": mix})


def run_heads(model, sources, capacity, options: LayerSplitHeadsOptions) -> BudgetMap:
    scores = layer_scores(sources[0][0], layer_score=options.layer_score)
    return _run("layer_split_heads", model, sources, capacity, options, scores, {"layer_score": options.layer_score})


RETENTION_ALLOCATOR = Allocator("layer_split", ("layer_retention",),
                                "best layers by retention global, the rest a sliding window (engines' layer split)",
                                LayerSplitOptions, run_retention, policy=SPLIT_POLICY)
HEADS_ALLOCATOR = Allocator("layer_split_heads", ("head_scores",),
                            "best layers by head scores global, the rest a sliding window (engines' layer split)",
                            LayerSplitHeadsOptions, run_heads, policy=SPLIT_POLICY)

__all__ = ("HEADS_ALLOCATOR", "RETENTION_ALLOCATOR", "SPLIT_TARGETS", "LayerSplitHeadsOptions", "LayerSplitOptions",
           "SplitOptions", "split_target", "split_targets")
