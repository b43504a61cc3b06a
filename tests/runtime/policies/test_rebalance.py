"""The cache-level hook through which a policy changes layers other than the one being prefilled.

A policy returns a :class:`~headprobe.runtime.policies.Rebalance` from ``rebalance(ctx)``; the cache cuts the
named layers to their first pairs and, when asked, re-lays them out with decode room. This is the only way a
policy reaches another layer's store (DynamicKV's cross-layer budgets use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from headprobe.runtime.generate import generate_compressed
from headprobe.runtime.policies import LayerContext, Rebalance, ScorerPolicy
from headprobe.runtime.shared_prefill import generate_from_prefill, record_prefill

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["The river ran past the old mill. Fishermen waited on the bank while the rain came down. " * 2]
KEEP, CAPACITY, NEW = 3, 10, 5


@dataclass
class OldestThenCut(ScorerPolicy):
    """Keeps the window plus the oldest tokens, each head's oldest first; once the last layer is prefilled,
    cuts every earlier layer to its first ``KEEP`` pairs and gives them their decode room."""

    name: ClassVar[str] = "oldest_then_cut"
    window: int = 2

    def score(self, ctx: LayerContext) -> torch.Tensor:
        return -ctx.positions.float()[:, None, :].expand(-1, ctx.kv_heads, -1)

    def rebalance(self, ctx: LayerContext) -> Rebalance | None:
        if ctx.layer_idx != ctx.shape.cached_layers[-1]:
            return None
        cut = torch.full((ctx.batch * ctx.kv_heads,), KEEP)
        return Rebalance({layer: cut for layer in range(ctx.layer_idx)}, room=ctx.max_new_tokens)


@pytest.mark.parametrize("replayed", [False, True])
def test_the_cache_applies_what_the_hook_returns(tiny_llama, replayed):
    if replayed:
        res = generate_from_prefill(tiny_llama, record_prefill(tiny_llama, PROMPTS), policy=OldestThenCut(),
                                    capacity=CAPACITY, max_new_tokens=NEW)
    else:
        res = generate_compressed(tiny_llama, PROMPTS, policy=OldestThenCut(), capacity=CAPACITY, max_new_tokens=NEW,
                                  min_new_tokens=NEW)
    cache, last = res.cache, tiny_llama.identity.num_layers - 1
    kept, peak = cache.kept_tokens()[0], cache.peak_tokens()[0]
    assert kept[:last].unique().tolist() == [KEEP + NEW - 1]          # cut at prefill, then decoding appended
    assert kept[last].unique().tolist() == [CAPACITY + NEW - 1]       # the last layer is not cut
    assert peak[:last].unique().tolist() == [CAPACITY]                # what they held before the cut
    for layer in cache.layers[:last]:
        assert layer.capacity.unique().tolist() == [KEEP + NEW - 1]   # the decode room: the last new token is never fed back
        view = layer.padded()
        first = view["positions"][:, :KEEP]                           # the oldest of the prompt, kept first
        assert first.tolist() == [list(range(KEEP))] * layer.segments


def test_without_a_hook_no_other_layer_changes(tiny_llama):
    @dataclass
    class Oldest(OldestThenCut):
        name: ClassVar[str] = "oldest"

        def rebalance(self, ctx: LayerContext) -> Rebalance | None:
            return super(OldestThenCut, self).rebalance(ctx)

    res = generate_compressed(tiny_llama, PROMPTS, policy=Oldest(), capacity=CAPACITY, max_new_tokens=1)
    assert res.cache.kept_tokens().unique().tolist() == [CAPACITY]
