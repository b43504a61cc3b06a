"""``CompressedCache``: a transformers ``Cache`` that stores only the tokens the budget keeps.

``update`` does not concatenate anything: it hands the new keys/values to the layer slot and returns the
slot itself, which transformers passes unchanged to the attention function registered as ``headprobe``
(:mod:`headprobe.runtime.cache_attention`). That function runs the policy: full attention over the prompt and
compression at prefill, ragged attention over the per-head store while decoding.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..errors import HeadprobeError
from ..models.identity import text_config
from .budget_sources import BudgetSource, UniformBudget
from .policies.base import LayerContext, Policy
from .store import LayerStore


class LayerSlot(CacheLayerMixin):
    """Per-layer bookkeeping seen by transformers; the pairs themselves live in a :class:`LayerStore`."""

    supports_early_init = False
    is_compileable = False

    def __init__(self, cache: CompressedCache, layer_idx: int, is_sliding: bool) -> None:
        super().__init__()
        self.cache = cache
        self.layer_idx = layer_idx
        self.is_sliding = is_sliding
        self.seen = 0            # columns of input ids processed (padding included)
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self.is_initialized = True
        self.pending = (key_states, value_states)
        self.seen += key_states.shape[-2]
        return self, self

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.seen = 0
        self.pending = None
        self.cache.stores[self.layer_idx] = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise HeadprobeError("CompressedCache does not support beam search (num_beams > 1)")

    def crop(self, tokens_to_remove: int) -> None:
        raise HeadprobeError("CompressedCache cannot be cropped (assisted decoding is not supported)")


class CompressedCache(Cache):
    """Per (batch row, layer, KV head) storage of the kept tokens only.

    Parameters
    ----------
    config
        The model's config (``model.config``).
    policy
        Which tokens to keep (:mod:`headprobe.runtime.policies`); default SnapKV.
    budget
        Where per-head budgets come from (:mod:`headprobe.runtime.budget_sources`); default capacity 128.
    max_new_tokens
        Decode room preallocated per segment (segments grow by re-layout if it runs out).
    attention_mask
        ``[batch, prompt_len]`` left-padded prompt mask; without it padding is inferred from the
        ``position_ids`` generate passes (or assumed absent).

    Examples
    --------
    >>> cache = CompressedCache(model.config, SnapKV(), UniformBudget(128), max_new_tokens=64)
    >>> with headprobe_attention(model):
    ...     out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64)
    >>> cache.memory_bytes(), cache.kept_tokens()
    """

    def __init__(self, config: Any, policy: Policy | None = None, budget: BudgetSource | None = None,
                 max_new_tokens: int = 256, attention_mask: torch.Tensor | None = None) -> None:
        from .policies.snapkv import SnapKV

        cfg = text_config(config)
        self.num_layers = int(cfg.num_hidden_layers)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        types = getattr(cfg, "layer_types", None) or ["full_attention"] * self.num_layers
        self.layer_types = list(types)
        self.policy = policy if policy is not None else SnapKV()
        self.budget = budget if budget is not None else UniformBudget(128)
        self.max_new_tokens = int(max_new_tokens)
        self.stores: list[LayerStore | None] = [None] * self.num_layers
        self.pad: torch.Tensor | None = None
        self.budgets: torch.Tensor | None = None  # [batch, layers, kv_heads]
        self.prompt_lengths: torch.Tensor | None = None
        self.layer_state: dict[int, dict[str, Any]] = {}  # policy scratch per layer
        if attention_mask is not None:
            self.set_padding(attention_mask)
        slots = [LayerSlot(self, i, t == "sliding_attention") for i, t in enumerate(self.layer_types)]
        super().__init__(layers=slots)
        from .policies.sliding import SlidingWindow
        self._sliding_policy = SlidingWindow()

    # ---- setup -----------------------------------------------------------------------------------

    def set_padding(self, attention_mask: torch.Tensor) -> None:
        """Record left padding from a ``[batch, prompt_len]`` 0/1 mask."""
        mask = attention_mask.bool()
        if mask.shape[1] and bool((mask[:, 1:].long() - mask[:, :-1].long() < 0).any()):
            raise HeadprobeError("CompressedCache needs left padding (tokenizer.padding_side = 'left')")
        self.pad = (~mask).long().sum(1)

    # ---- reports ---------------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Bytes allocated by every layer's store (buffers, metadata, policy state)."""
        return sum(s.memory_bytes() for s in self.stores if s is not None)

    def used_bytes(self) -> int:
        """Bytes of the pairs actually held (lengths × bytes per token)."""
        return sum(int(s.lengths.sum()) * s.bytes_per_token() for s in self.stores if s is not None)

    def kept_tokens(self) -> torch.Tensor:
        """``[batch, layers, kv_heads]`` tokens held per head now."""
        return torch.stack([s.kept() for s in self.stores], 1)

    def peak_tokens(self) -> torch.Tensor:
        """``[batch, layers, kv_heads]`` the most tokens each head ever held."""
        return torch.stack([s.peak_lengths.reshape(s.batch, s.kv_heads).clone() for s in self.stores], 1)

    def full_cache_bytes(self, tokens: int | None = None) -> int:
        """Bytes a full (uncompressed) cache of the same dtype would hold for the tokens seen so far."""
        store = next(s for s in self.stores if s is not None)
        tokens = self.layers[0].seen if tokens is None else tokens
        per = 2 * store.head_dim * store.keys.element_size()
        return store.batch * self.num_layers * self.num_kv_heads * tokens * per

    # ---- the attention call ----------------------------------------------------------------------

    def attend(self, slot: LayerSlot, query: torch.Tensor, scaling: float, sliding_window: int | None,
               softcap: float | None, position_ids: torch.Tensor | None) -> torch.Tensor:
        """Run the policy for one layer; returns ``[batch, q_heads, n, head_dim]``."""
        keys, values = slot.pending
        slot.pending = None
        prefill = self.stores[slot.layer_idx] is None
        ctx, policy = self._layer_context(slot, query, keys, values, scaling, sliding_window, softcap,
                                          position_ids, prefill)
        return policy.prefill(ctx) if prefill else policy.decode(ctx)

    def compress_prompt(self, layers: list[Any]) -> None:
        """Fill every layer's store from a recorded prompt forward instead of running it again.

        Parameters
        ----------
        layers
            Per layer, in order, a record with ``query`` ``[batch, q_heads, n, head_dim]``, ``keys`` and
            ``values`` ``[batch, kv_heads, n, head_dim]``, ``scaling``, ``sliding_window``, ``softcap`` and
            ``position_ids`` (:class:`headprobe.runtime.shared_prefill.RecordedLayer`).

        Raises
        ------
        HeadprobeError
            A cache that already holds a prompt, or a policy whose prefill is not plain attention.
        """
        if any(s is not None for s in self.stores):
            raise HeadprobeError("CompressedCache.compress_prompt: the cache already holds a prompt")
        if not self.policy.full_prefill:
            raise HeadprobeError(f"policy {self.policy.name}: its prefill is not plain attention, so a recorded "
                                 "prefill cannot be replayed; run generate_compressed instead")
        for rec in layers:
            slot = self.layers[rec.layer_idx]
            slot.seen = rec.keys.shape[2]
            slot.is_initialized = True
            ctx, policy = self._layer_context(slot, rec.query, rec.keys, rec.values, rec.scaling,
                                              rec.sliding_window, rec.softcap, rec.position_ids, True)
            policy.compress(ctx)

    def _layer_context(self, slot: LayerSlot, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       scaling: float, sliding_window: int | None, softcap: float | None,
                       position_ids: torch.Tensor | None, prefill: bool) -> tuple[LayerContext, Policy]:
        """The policy context of one attention call of ``slot`` (budgets resolved at the first prefill)."""
        b, n = keys.shape[0], keys.shape[2]
        start = slot.seen - n
        if prefill and self.pad is None:
            self.pad = _infer_padding(position_ids, b, n, keys.device)
        pad = self.pad.to(keys.device) if self.pad is not None else torch.zeros(b, dtype=torch.long,
                                                                                  device=keys.device)
        positions = start + torch.arange(n, device=keys.device)[None, :] - pad[:, None]
        valid = positions >= 0
        policy = self._sliding_policy if sliding_window else self.policy
        budgets = None
        if prefill:
            if self.budgets is None:
                self.prompt_lengths = valid.long().sum(1)
                self.budgets = self.budget.resolve(self, self.prompt_lengths, self.policy).to(keys.device)
            budgets = self.budgets[:, slot.layer_idx]
        ctx = LayerContext(self, slot.layer_idx, query, keys, values, positions, valid, budgets, scaling,
                           sliding_window, softcap)
        return ctx, policy


def _infer_padding(position_ids: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Left padding per row from generate's ``position_ids`` (``cumsum(mask) - 1``, 0 on padding)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] != n:
        return torch.zeros(batch, dtype=torch.long, device=device)
    pos = position_ids.to(device).long().expand(batch, n)
    return (n - 1 - pos.max(dim=1).values).clamp(min=0)
