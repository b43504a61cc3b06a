"""Budgets of a layer split: a local layer's window, a global layer every token.

Unlike :class:`~headprobe.runtime.budget_sources.MapBudget`, nothing is rescaled or redistributed: an engine
keeps ``W`` tokens in a local layer whatever the prompt, and everything in a global layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..files.jsonio import read_json
from ..layer_split import GLOBAL, SPLIT_FORMAT, LayerSplit
from ..limits import MAX_TOKENS
from ..models.identity import ModelIdentity
from .budget_sources import BudgetSource
from .policies.base import Policy
from .shape import CacheShape

#: The budget of a global layer: more than any prompt plus its new tokens, so nothing is ever evicted.
WHOLE = MAX_TOKENS


@dataclass
class SplitBudget(BudgetSource):
    """Per layer its window (``split.layers[l]``, sink included) or :data:`WHOLE`, the same for every row and
    KV head.

    Parameters
    ----------
    split
        The layer split.
    identity
        The model's identity; when given, a split made for another model is refused.
    """

    split: LayerSplit
    identity: ModelIdentity | None = None

    @classmethod
    def from_map(cls, bm: BudgetMap, identity: ModelIdentity | None = None) -> SplitBudget:
        """The split a ``layer_split`` budget map carries (``method.layer_split``)."""
        split = LayerSplit.in_map(bm)
        if split is None:
            raise HeadprobeError("the budget map carries no layer split (method.layer_split)")
        return cls(split, identity)

    def resolve(self, shape: CacheShape, prompt_lengths: torch.Tensor, policy: Policy) -> torch.Tensor:
        if self.identity is not None:
            self.split.model.check_fits(self.identity, what="layer split")
        if len(self.split.layers) != shape.num_layers:
            raise HeadprobeError(f"layer split has {len(self.split.layers)} layers but the model {shape.num_layers}")
        if policy.name != "layer_window":
            raise HeadprobeError(f"a layer split runs under the layer_window policy (the engine's rule), not "
                                 f"{policy.name}")
        if getattr(policy, "sink", 0) != self.split.sink:
            raise HeadprobeError(f"policy layer_window: sink {policy.sink}, but the split keeps a sink of "
                                 f"{self.split.sink} (option sink={self.split.sink})")
        per_layer = torch.tensor([WHOLE if w == GLOBAL else int(w) for w in self.split.layers], dtype=torch.long)
        b = prompt_lengths.shape[0]
        return per_layer[None, :, None].expand(b, -1, shape.num_kv_heads).clone()

    def describe(self) -> str:
        return f"layer split ({self.split.engine}, global layers {self.split.global_layers})"


def is_split_map(budget: object) -> bool:
    """Whether ``budget`` is a budget map that carries a layer split (``allocate --method layer_split``)."""
    return isinstance(budget, BudgetMap) and isinstance(budget.method.get("layer_split"), dict)


def load_budget_file(path: str | Path) -> LayerSplit | BudgetMap:
    """A layer-split file (``headprobe.layer_split``) or a budget map, by the file's ``format``."""
    obj = read_json(path)
    if isinstance(obj, dict) and obj.get("format") == SPLIT_FORMAT:
        return LayerSplit.load(path)
    return BudgetMap.load(path)


__all__ = ("WHOLE", "SplitBudget", "is_split_map", "load_budget_file")
