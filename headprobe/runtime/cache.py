"""``CompressedCache``: a transformers ``Cache`` that stores only the tokens the budget keeps.

Two levels, as in transformers: the cache and its layers (:class:`CompressedLayer`, a transformers cache
layer whose storage is a :class:`~headprobe.runtime.store.LayerStore`). ``update`` concatenates nothing:
it keeps the new keys/values in the layer and returns the layer's :class:`PendingKV` handle in place of
both tensors. transformers passes that handle unchanged to the attention function registered as
``headprobe`` (:func:`headprobe_attention_forward`, at the end of this module), which asks the cache to run
the layer's policy: full attention over the prompt and compression at prefill, ragged attention over the
per-head store while decoding. No mask function is registered: the cache knows the positions and padding. A model whose attention uses the returned keys/values
as tensors (``key_states.shape``, ``torch.cat``, ``repeat_kv``) touches the handle, which refuses in one
line (``docs/runtime.md``, "How it plugs into transformers").
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..attention.registry import attention_switched, register_attention
from ..errors import HeadprobeError
from .budget_sources import BudgetSource
from .decode_room import first_room
from .policies.base import LayerContext, Policy
from .shape import SLIDING, CacheShape
from .store import LayerStore, host_array

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_SUPPORTED = ("passes what Cache.update returns unchanged to the attention function (as transformers' Llama, "
              "Mistral, Qwen2 and Gemma 3 do)")


def _misuse(layer: int | str, what: str) -> str:
    return (f"layer {layer}: the model's attention uses the keys/values returned by CompressedCache.update "
            f"as tensors ({what}); the compressed cache needs an attention that {_SUPPORTED}")


def _refusing(what: str) -> Any:
    """A method of :class:`PendingKV` that refuses its use as a tensor (``what``: the operator)."""

    def refuse(self: PendingKV, *args: Any, **kwargs: Any) -> Any:
        raise HeadprobeError(_misuse(self.layer.layer_idx, what))

    return refuse


class PendingKV:
    """What ``CompressedCache.update`` returns in place of the key and value tensors.

    It only carries the layer to the ``headprobe`` attention function. Used as a tensor (an attribute
    such as ``.shape``, an operator, or a torch function such as ``torch.cat``), it raises
    :class:`~headprobe.errors.HeadprobeError` with one line instead of letting the model compute garbage.

    It holds its cache and layer by weak reference: the layer keeps its handle, so strong references would
    make every cache a reference cycle, whose buffers only Python's cycle collector frees, late and in
    bulk (a long eval then held one dead cache per answer until memory ran out). With weak ones a cache's
    memory is freed as soon as the last reference to the cache goes.
    """

    __slots__ = ("_cache", "_layer")

    def __init__(self, cache: CompressedCache, layer: CompressedLayer) -> None:
        self._cache = weakref.ref(cache)
        self._layer = weakref.ref(layer)

    @property
    def cache(self) -> CompressedCache:
        return self._cache()

    @property
    def layer(self) -> CompressedLayer:
        return self._layer()

    def __getattr__(self, name: str) -> Any:
        raise HeadprobeError(_misuse(self.layer.layer_idx, f".{name}"))

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        flat = [*args, *(kwargs or {}).values()]
        flat += [x for a in flat if isinstance(a, (list, tuple)) for x in a]     # torch.cat([key, ...])
        layer = next((a.layer.layer_idx for a in flat if isinstance(a, PendingKV)), "?")
        raise HeadprobeError(_misuse(layer, getattr(func, "__name__", str(func))))

    __getitem__ = _refusing("__getitem__")
    __setitem__ = _refusing("__setitem__")
    __len__ = _refusing("__len__")
    __iter__ = _refusing("__iter__")
    __bool__ = _refusing("__bool__")
    __array__ = _refusing("__array__")
    __add__ = __radd__ = _refusing("+")
    __sub__ = __rsub__ = _refusing("-")
    __mul__ = __rmul__ = _refusing("*")
    __truediv__ = __rtruediv__ = _refusing("/")
    __matmul__ = __rmatmul__ = _refusing("@")

    def __repr__(self) -> str:
        return f"PendingKV(layer {self.layer.layer_idx})"


class CompressedLayer(LayerStore, CacheLayerMixin):
    """One layer of a :class:`CompressedCache`: what transformers calls, the kept pairs, the policy's state.

    As a :class:`~headprobe.runtime.store.LayerStore` it holds the pairs its policy keeps (empty until the
    layer's prefill); as a transformers cache layer it takes the keys and values of each call in
    :meth:`update` until the attention asks for them.

    Attributes
    ----------
    layer_idx
        Layer index.
    is_sliding
        Whether the layer is a sliding-window layer (served by the cache's ``sliding_policy``).
    seen
        Columns of input ids processed (padding included).
    pending
        The keys and values of the current call, from ``update`` until the attention takes them.
    state
        The policy's per-layer state (an instance of :attr:`Policy.layer_state`), ``None`` without one.
    handle
        The :class:`PendingKV` that ``update`` returns.
    """

    supports_early_init = False
    is_compileable = False

    def __init__(self, cache: CompressedCache, layer_idx: int, is_sliding: bool) -> None:
        LayerStore.__init__(self)
        CacheLayerMixin.__init__(self)
        self.layer_idx = layer_idx
        self.is_sliding = is_sliding
        self.seen = 0
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.state: Any = None
        self.handle = PendingKV(cache, self)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:  # noqa: ARG002 (transformers' Cache API)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[PendingKV, PendingKV]:
        if self.pending is not None:
            raise HeadprobeError(f"layer {self.layer_idx}: the keys stored by the previous CompressedCache.update "
                                 f"never reached the headprobe attention; the compressed cache needs an attention "
                                 f"that {_SUPPORTED}")
        self.is_initialized = True
        self.pending = (key_states, value_states)
        self.seen += key_states.shape[-2]
        return self.handle, self.handle

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The pending keys and values ``[batch, kv_heads, n, head_dim]`` (the layer forgets them)."""
        if self.pending is None:
            raise HeadprobeError(f"layer {self.layer_idx}: the headprobe attention was called without "
                                 f"CompressedCache.update for this layer; the compressed cache needs an "
                                 f"attention that {_SUPPORTED}")
        keys, values = self.pending
        self.pending = None
        return keys, values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        # early 5.x releases pass the new tokens' cache_position tensor instead of their count
        new = query_length if isinstance(query_length, int) else int(query_length.shape[0])
        return self.seen + new, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:      # the name of get_max_length in early 5.x releases
        return -1

    def reset(self) -> None:
        self.seen = 0
        self.pending = None
        self.state = None
        self.release()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:  # noqa: ARG002 (transformers' Cache API)
        raise HeadprobeError("CompressedCache does not support beam search (num_beams > 1)")

    def crop(self, tokens_to_remove: int) -> None:  # noqa: ARG002 (transformers' Cache API)
        raise HeadprobeError("CompressedCache cannot be cropped (assisted decoding is not supported)")


class CompressedCache(Cache):
    """Per (batch row, layer, KV head) storage of the kept tokens only.

    The cache knows each row's left padding (from the attention mask, or inferred from the
    ``position_ids`` generate passes) and so every token's absolute position.

    Parameters
    ----------
    config
        The model's config (``model.config``) or a :class:`~headprobe.runtime.shape.CacheShape`.
    policy
        Which tokens to keep (:mod:`headprobe.runtime.policies`).
    budget
        Where per-head budgets come from (:mod:`headprobe.runtime.budget_sources`).
    max_new_tokens
        Decode room preallocated per segment (segments grow by re-layout if it runs out).
    attention_mask
        ``[batch, prompt_len]`` left-padded prompt mask; without it padding is inferred from the
        ``position_ids`` generate passes (or assumed absent).
    sliding_policy
        The policy of the sliding-window layers (Gemma 3's local layers), required when the model has
        some: :class:`~headprobe.runtime.policies.SlidingWindow` keeps exactly the window.

    Examples
    --------
    ``with_cache`` (:mod:`headprobe.models.cache_argument`) passes the cache as ``cache=`` (transformers 5.24
    and later) or ``past_key_values=`` (earlier 5.x), whichever the model declares:

    >>> cache = CompressedCache(model.config, SnapKV(), UniformBudget(128), max_new_tokens=64)
    >>> with headprobe_attention(model):
    ...     out = model.generate(**inputs, **with_cache(model, cache), max_new_tokens=64)
    >>> cache.memory_bytes(), cache.kept_tokens()
    """

    def __init__(self, config: Any, policy: Policy, budget: BudgetSource, max_new_tokens: int = 256,
                 attention_mask: torch.Tensor | None = None, sliding_policy: Policy | None = None) -> None:
        shape = config if isinstance(config, CacheShape) else CacheShape.from_config(config)
        if sliding_policy is None and SLIDING in shape.layer_types:
            layer = shape.layer_types.index(SLIDING)
            raise HeadprobeError(f"layer {layer} is a sliding-window layer: CompressedCache needs sliding_policy "
                                 "(SlidingWindow() keeps the window; generate_compressed passes it)")
        self.shape = shape
        self.policy = policy
        self.sliding_policy = sliding_policy
        self.budget = budget
        self.max_new_tokens = max_new_tokens
        self.budgets: torch.Tensor | None = None          # [batch, layers, kv_heads], at the first prefill
        self._budgets_on: dict[torch.device, torch.Tensor] = {}   # copies on the devices of later layers
        self._host_budgets: list[np.ndarray] = []          # per layer [batch * kv_heads], on the host
        self.prompt_lengths: torch.Tensor | None = None   # [batch]
        self._policy_shared = _new(policy.cache_state)
        self._sliding_shared = _new(sliding_policy.cache_state) if sliding_policy is not None else None
        self.pad: torch.Tensor | None = None
        if attention_mask is not None:
            self.set_padding(attention_mask)
        super().__init__(layers=[CompressedLayer(self, i, shape.is_sliding(i)) for i in range(shape.num_layers)])

    @property
    def num_layers(self) -> int:
        return self.shape.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.shape.num_kv_heads

    @property
    def layer_types(self) -> list[str]:
        return list(self.shape.layer_types)

    def set_padding(self, attention_mask: torch.Tensor) -> None:
        """Record left padding from a ``[batch, prompt_len]`` 0/1 mask."""
        mask = attention_mask.bool()
        if mask.shape[1] and bool((mask[:, 1:].long() - mask[:, :-1].long() < 0).any()):
            raise HeadprobeError("CompressedCache needs left padding (tokenizer.padding_side = 'left')")
        self.pad = (~mask).long().sum(1)

    # ---- reports ---------------------------------------------------------------------------------

    @property
    def stores(self) -> list[CompressedLayer | None]:
        """Every layer holding its pairs, in order (``None`` before the layer's prefill)."""
        return [layer if layer.allocated else None for layer in self.layers]

    def memory_bytes(self) -> int:
        """Bytes allocated by every layer (buffers, metadata, policy state)."""
        return sum(s.memory_bytes() for s in self.stores if s is not None)

    def used_bytes(self) -> int:
        """Bytes of the pairs actually held (lengths × bytes per token)."""
        return sum(s.used_bytes() for s in self.stores if s is not None)

    def kept_tokens(self) -> torch.Tensor:
        """``[batch, layers, kv_heads]`` tokens held per head now (on the first layer's device)."""
        return _stack_layers([s.kept() for s in self.stores])

    def peak_tokens(self) -> torch.Tensor:
        """``[batch, layers, kv_heads]`` the most tokens each head ever held (on the first layer's device)."""
        return _stack_layers([s.peak() for s in self.stores])

    def full_cache_bytes(self, tokens: int | None = None) -> int:
        """Bytes a full (uncompressed) cache of the same dtype would hold for the tokens seen so far."""
        store = next(s for s in self.stores if s is not None)
        tokens = self.layers[0].seen if tokens is None else tokens
        per = 2 * store.head_dim * store.element_size()
        return store.batch * self.num_layers * self.num_kv_heads * tokens * per

    # ---- several caches decoding as one batch ----------------------------------------------------

    def decode_key(self) -> tuple[Any, ...] | None:
        """What decoding does to this cache (its policies' :meth:`~headprobe.runtime.policies.Policy.decode_group`,
        the sliding layers' too when the model has some); ``None`` when it decodes alone. Caches with equal
        keys decode their rows together (:meth:`stack`)."""
        main = self.policy.decode_group()
        if main is None:
            return None
        if SLIDING not in self.shape.layer_types:
            return (main, None)
        side = self.sliding_policy.decode_group()
        return None if side is None else (main, side)

    @classmethod
    def stack(cls, caches: list[CompressedCache]) -> CompressedCache:
        """One cache whose batch rows are the rows of ``caches`` (in order), each holding its prompt.

        The rows keep their own pairs, budgets, padding and decode room, so decoding the stacked cache
        changes each row exactly as decoding its own cache would (the caches must share a
        :meth:`decode_key`). The sources' stores are emptied; :meth:`give_rows` gives the rows back.

        Raises
        ------
        HeadprobeError
            A cache that decodes alone, caches that decode differently or hold different prompt lengths,
            or one without its prompt.
        """
        first = caches[0]
        keys = {c.decode_key() for c in caches}
        if None in keys or len(keys) > 1:
            raise HeadprobeError("CompressedCache.stack: the caches do not decode alike (decode_key)")
        if any(c.budgets is None for c in caches) or len({c.layers[0].seen for c in caches}) > 1:
            raise HeadprobeError("CompressedCache.stack: every cache must hold the same prompt's tokens")
        merged = cls(first.shape, first.policy, first.budget, max_new_tokens=first.max_new_tokens,
                     sliding_policy=first.sliding_policy)
        merged.pad = torch.cat([c.pad.to(first.pad.device) for c in caches])
        merged.prompt_lengths = torch.cat([c.prompt_lengths.to(first.prompt_lengths.device) for c in caches])
        merged.budgets = torch.cat([c.budgets.to(first.budgets.device) for c in caches])
        merged._budgets_on = {merged.budgets.device: merged.budgets}
        merged._host_budgets = [np.concatenate([c._host_budgets[i] for c in caches]) for i in range(first.num_layers)]
        for i, layer in enumerate(merged.layers):
            layer.stack_rows([c.layers[i] for c in caches])
            layer.seen = first.layers[i].seen
            layer.is_initialized = True
            for c in caches:
                c.layers[i].release()
        return merged

    def give_rows(self, cache: CompressedCache, first: int, seen: int | None = None) -> None:
        """Give ``cache`` (one of the caches :meth:`stack` took) its rows back: the batch rows
        ``first .. first + cache's rows - 1`` of this cache, as they stand now; ``seen`` is the tokens the
        rows had taken when they finished (default: this cache's)."""
        rows = cache.pad.shape[0]
        for i, layer in enumerate(cache.layers):
            layer.take_rows(self.layers[i], first, rows)
            layer.seen = self.layers[i].seen if seen is None else seen

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only the batch rows ``rows`` (in that order): the finished rows of a stacked cache leave it,
        the others decode on as before (their pairs copied once into new buffers, layer by layer)."""
        pick = torch.tensor(rows, dtype=torch.long)
        self.pad = self.pad[pick.to(self.pad.device)]
        self.prompt_lengths = self.prompt_lengths[pick.to(self.prompt_lengths.device)]
        self.budgets = self.budgets[pick.to(self.budgets.device)]
        self._budgets_on = {self.budgets.device: self.budgets}
        h = self.num_kv_heads
        segs = np.concatenate([np.arange(r * h, (r + 1) * h) for r in rows])
        self._host_budgets = [b[segs] for b in self._host_budgets]
        for layer in self.layers:
            layer.keep_rows(rows)

    def freeze_rows(self, first: int, count: int) -> None:
        """Rows ``first .. first + count - 1`` have finished: from now on every layer keeps them as they are."""
        for layer in self.layers:
            layer.freeze_rows(first, count)

    # ---- the attention call ----------------------------------------------------------------------

    def attend(self, layer: CompressedLayer, query: torch.Tensor, scaling: float, sliding_window: int | None,
               softcap: float | None, position_ids: torch.Tensor | None) -> torch.Tensor:
        """Run the policy for one layer; returns ``[batch, q_heads, n, head_dim]``."""
        keys, values, positions, valid = self.take_call(layer, query, sliding_window, position_ids)
        prefill = not layer.allocated
        policy, ctx = self._layer_context(layer, query, keys, values, positions, valid, scaling, sliding_window,
                                          softcap)
        if not prefill:
            return policy.decode(ctx)
        out = policy.prefill(ctx)
        self._rebalance(policy, ctx)
        return out

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
            layer = self.layers[rec.layer_idx]
            layer.update(rec.keys, rec.values)
            keys, values, positions, valid = self.take_call(layer, rec.query, rec.sliding_window, rec.position_ids)
            policy, ctx = self._layer_context(layer, rec.query, keys, values, positions, valid, rec.scaling,
                                              rec.sliding_window, rec.softcap)
            ctx.memo = getattr(rec, "memo", None)          # results shared by the caches of one record
            policy.compress(ctx)
            self._rebalance(policy, ctx)

    def take_call(self, layer: CompressedLayer, query: torch.Tensor, sliding_window: int | None,
                  position_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pending keys and values of ``layer``, checked against the query, and their positions.

        Returns
        -------
        keys, values, positions, valid
            ``[batch, kv_heads, n, head_dim]`` twice, ``[batch, n]`` absolute positions (negative for left
            padding) and ``[batch, n]`` bool (False for padding).
        """
        keys, values = layer.take()
        index = layer.layer_idx
        if keys.shape[-1] != values.shape[-1] or query.shape[-1] != keys.shape[-1]:
            raise HeadprobeError(f"layer {index}: query, key and value head sizes differ ({query.shape[-1]}, "
                                 f"{keys.shape[-1]}, {values.shape[-1]}); the compressed cache needs one head_dim")
        if keys.dim() != 4 or query.shape[1] % keys.shape[1] or keys.shape[1] != self.shape.num_kv_heads:
            raise HeadprobeError(f"layer {index}: {query.shape[1]} query heads over keys shaped "
                                 f"{tuple(keys.shape)}; expected [batch, {self.shape.num_kv_heads} KV heads, "
                                 f"tokens, head_dim] with the query heads a multiple of the KV heads")
        if bool(sliding_window) != layer.is_sliding:
            declared = self.shape.layer_types[index]
            raise HeadprobeError(f"layer {index}: the attention passes sliding_window={sliding_window} but the "
                                 f"config declares it {declared!r}")
        b, n = keys.shape[0], keys.shape[2]
        if self.pad is None:      # the first call is the prompt's: generate's position_ids tell the padding
            self.pad = _infer_padding(position_ids, b, n, keys.device)
        pad = self.pad.to(keys.device)
        positions = layer.seen - n + torch.arange(n, device=keys.device)[None, :] - pad[:, None]
        return keys, values, positions, positions >= 0

    def check_attended(self) -> None:
        """Refuse a forward after which some layer's keys never reached the headprobe attention."""
        for layer in self.layers:
            if layer.pending is not None:
                raise HeadprobeError(f"layer {layer.layer_idx}: the keys stored by CompressedCache.update never "
                                     f"reached the headprobe attention; the compressed cache needs an attention "
                                     f"that {_SUPPORTED}")

    def _layer_context(self, layer: CompressedLayer, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       positions: torch.Tensor, valid: torch.Tensor, scaling: float, sliding_window: int | None,
                       softcap: float | None) -> tuple[Policy, LayerContext]:
        """The policy of ``layer`` and its context for this call (budgets resolved at the first prefill)."""
        if self.budgets is None:
            self.prompt_lengths = valid.long().sum(1)
            resolved = self.budget.resolve(self.shape, self.prompt_lengths, self.policy)
            host = host_array(resolved)
            self._host_budgets = [host[:, i].reshape(-1).copy() for i in range(self.num_layers)]
            self.budgets = resolved.to(keys.device)
            self._budgets_on = {self.budgets.device: self.budgets}
        budgets = self._budgets_on.get(keys.device)
        if budgets is None:       # a layer on another device than the first (accelerate's device_map)
            budgets = self._budgets_on[keys.device] = self.budgets.to(keys.device)
        policy, shared = ((self.sliding_policy, self._sliding_shared) if layer.is_sliding
                          else (self.policy, self._policy_shared))
        if layer.state is None:
            layer.state = _new(policy.layer_state)
        index = layer.layer_idx
        return policy, LayerContext(
            layer_idx=index, store=layer, state=layer.state, shape=self.shape, max_new_tokens=self.max_new_tokens,
            query=query, keys=keys, values=values, positions=positions, valid=valid, budgets=budgets[:, index],
            host_budgets=self._host_budgets[index], scaling=scaling, sliding_window=sliding_window,
            softcap=softcap, shared=shared)

    def _rebalance(self, policy: Policy, ctx: LayerContext) -> None:
        """Apply what ``policy`` changes across layers once the prefill of ``ctx``'s layer is done."""
        change = policy.rebalance(ctx)
        if change is None:
            return
        for index, lengths in change.lengths.items():
            layer = self.layers[index]
            layer.keep_first(lengths)
            if change.room is not None:              # never more up front than a full cache would hold
                layer.relayout(first_room(np.broadcast_to(host_array(change.room), layer.host_lengths.shape),
                                          layer.host_lengths, host_array(self.prompt_lengths).repeat(layer.kv_heads),
                                          self.max_new_tokens))


def _stack_layers(per_layer: list[torch.Tensor]) -> torch.Tensor:
    """``[batch, layers, kv_heads]`` from per-layer ``[batch, kv_heads]`` tensors, which live on each layer's
    device when accelerate spread the model; the stack is on the first one's."""
    device = per_layer[0].device
    return torch.stack([t.to(device) for t in per_layer], 1)


def _new(kind: type | None) -> Any:
    return kind() if kind is not None else None


def _infer_padding(position_ids: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """Left padding per row from generate's ``position_ids`` (``cumsum(mask) - 1``, 0 on padding)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] != n:
        return torch.zeros(batch, dtype=torch.long, device=device)
    pos = position_ids.to(device).long().expand(batch, n)
    return (n - 1 - pos.max(dim=1).values).clamp(min=0)


# The attention function transformers calls with what CompressedCache.update returned, and the switch that
# installs it on a model.

ATTENTION_NAME = "headprobe"
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def headprobe_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: Any, value: Any,
                                attention_mask: torch.Tensor | None, scaling: float | None = None,  # noqa: ARG001 (transformers' attention-function signature)
                                dropout: float = 0.0, sliding_window: int | None = None,  # noqa: ARG001 (transformers' attention-function signature)
                                softcap: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over a :class:`CompressedCache` layer.

    Parameters
    ----------
    query
        ``[batch, q_heads, n, head_dim]`` post-RoPE.
    key, value
        The :class:`~headprobe.runtime.cache.PendingKV` returned by ``CompressedCache.update`` (both).

    Returns
    -------
    tuple
        ``([batch, n, q_heads, head_dim], None)`` like transformers' attention functions.
    """
    if not isinstance(key, PendingKV) or value is not key:
        raise HeadprobeError("the headprobe attention needs a CompressedCache passed as the model's cache "
                             "(cache=, or past_key_values= before transformers 5.24) and the keys and values its "
                             "update returned (use headprobe.generate_compressed)")
    layer = key.layer
    index = getattr(module, "layer_idx", layer.layer_idx)
    if index != layer.layer_idx:
        raise HeadprobeError(f"the attention of layer {index} received the keys of layer {layer.layer_idx}; the "
                             "compressed cache needs each layer to update and attend its own cache layer")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = key.cache.attend(layer, query, float(scaling), sliding_window, softcap, kwargs.get("position_ids"))
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the attention implementation with transformers (idempotent); no mask builder: the
    ragged cache applies causality and windows itself."""
    register_attention(ATTENTION_NAME, headprobe_attention_forward, sdpa_masks=False)


def check_supported(hf_model: PreTrainedModel) -> CacheShape:
    """Refuse, in one line, a model the compressed cache cannot run; returns its cache shape.

    :func:`headprobe_attention` runs it on entry, before anything else the block does.

    Supported: decoder-only models whose attention goes through transformers' ``AttentionInterface``
    (``_supports_attention_backend``) with full-attention and sliding-window layers only.
    """
    config = hf_model.config
    shape = CacheShape.from_config(config)
    for i, kind in enumerate(shape.layer_types):
        if kind not in SUPPORTED_LAYER_TYPES:
            raise HeadprobeError(f"layer {i} has attention type {kind!r}; the compressed cache supports "
                                 f"{', '.join(SUPPORTED_LAYER_TYPES)}")
    name = type(hf_model).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise HeadprobeError(f"{name} is an encoder-decoder model; the compressed cache serves decoder-only models")
    if not getattr(hf_model, "_supports_attention_backend", False):
        raise HeadprobeError(f"{name} does not route its attention through transformers' AttentionInterface; the "
                             "compressed cache cannot run it")
    return shape


@contextlib.contextmanager
def headprobe_attention(model: PreTrainedModel) -> Iterator[Any]:
    """Switch ``model`` to the headprobe attention for the duration of the block, then restore it.

    A model the compressed cache cannot run is refused first (:func:`check_supported`)."""
    register()
    check_supported(model)
    with attention_switched(model, ATTENTION_NAME):
        yield model
