"""Which prompt tokens each KV head keeps: in headprobe's compressed cache, and under a kvpress press run by
kvpress's own code, for the same prompt and the same number of kept tokens.

The comparison behind "method parity" (docs/interop.md): for a method both toolkits implement, the kept
positions of every (layer, KV head) are read from each side's cache after prefill and compared head by
head.

- headprobe: :func:`headprobe_kept` prefills through ``model.generate`` with a
  :class:`~headprobe.runtime.cache.CompressedCache` and reads the absolute positions its store holds.
- kvpress: :func:`press_kept` prefills under ``with press(model)`` into a ``DynamicCache`` and reads what
  kvpress left: a scorer press gathers the kept keys (each kept key row is found, bit for bit, among the
  keys of an uncompressed prefill of the same prompt), a head-wise press (``AdaKVPress``,
  ``DuoAttentionPress``) keeps every key and lists the masked ones in ``module.masked_key_indices``.

kvpress is imported only by :func:`press_kept` (importing kvpress patches transformers' attention), so
the headprobe side and :func:`agreement` run without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..runtime.generate import generate_compressed
from .press_settings import pass_over_sliding_layers

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..models.loading import LoadedModel

#: ``[layer][kv_head]`` → the sorted prompt positions that head keeps.
Kept = list[list[tuple[int, ...]]]


@torch.no_grad()
def headprobe_kept(lm: LoadedModel, input_ids: torch.Tensor, policy: str, options: dict[str, Any] | None = None,
                   budget: Any = None, capacity: int | None = None) -> Kept:
    """The prompt positions each KV head of ``lm`` keeps after headprobe compresses the prefill of
    ``input_ids`` (``[1, tokens]``) with ``policy`` and ``budget`` (a map) or ``capacity`` (tokens per head).

    Returns
    -------
    Kept
        ``[layer][kv_head]`` sorted positions (layers the cache does not compress hold every position).
    """
    result = generate_compressed(lm, input_ids=input_ids, policy=policy, policy_options=options or {},
                                 budget=budget, capacity=capacity, max_new_tokens=1)
    n, heads = input_ids.shape[1], lm.identity.num_kv_heads
    out: Kept = []
    for layer in result.cache.stores:
        if layer is None or not layer.allocated:
            out.append([tuple(range(n))] * heads)
            continue
        view = layer.padded()
        positions, valid = view["positions"], view["valid"]          # [segments, width]
        out.append([tuple(sorted(int(p) for p, v in zip(positions[h].tolist(), valid[h].tolist(), strict=True)
                                 if v and p < n)) for h in range(heads)])
    return out


@torch.no_grad()
def full_keys(model: PreTrainedModel, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's ``[1, kv_heads, tokens, head_dim]`` keys of an uncompressed prefill of ``input_ids``."""
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import DynamicCache

    cache = DynamicCache()
    model(input_ids=input_ids, past_key_values=cache, use_cache=True)
    return _layer_keys(cache)


@torch.no_grad()
def press_kept(model: PreTrainedModel, press: Any, input_ids: torch.Tensor, keys: list[torch.Tensor] | None = None) -> Kept:
    """The prompt positions each KV head keeps after kvpress prefills ``input_ids`` (``[1, tokens]``) under
    ``press`` (any kvpress press), read from kvpress's own cache and masks. The press is run as a ``kvpress:``
    setting runs it: its hook is wrapped in place to pass over sliding-window layers
    (:func:`~headprobe.library_bridges.press_settings.pass_over_sliding_layers`, a no-op on other layers).

    Parameters
    ----------
    keys
        :func:`full_keys` of the same prompt, when already computed (one uncompressed prefill serves every
        press).

    Raises
    ------
    ValueError
        A kept key row that matches no key of the uncompressed prefill (the press changed the keys, as
        merging presses do: no positions can be read from it).
    """
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import DynamicCache

    keys = full_keys(model, input_ids) if keys is None else keys
    pass_over_sliding_layers(press)       # as a kvpress: setting runs it: sliding-window layers stay whole
    pressed = DynamicCache()
    with press(model):
        model(input_ids=input_ids, past_key_values=pressed, use_cache=True)
    masked = _masked_positions(model)
    out: Kept = []
    for index, (whole, kept) in enumerate(zip(keys, _layer_keys(pressed), strict=True)):
        heads = []
        for h in range(whole.shape[1]):
            positions = _row_positions(whole[0, h], kept[0, h], index, h)
            heads.append(tuple(sorted(set(positions) - masked.get((index, h), set()))))
        out.append(heads)
    return out


def _layer_keys(cache: Any) -> list[torch.Tensor]:
    """``[batch, kv_heads, tokens, head_dim]`` keys of every layer of a transformers ``DynamicCache``."""
    return [layer.keys for layer in cache.layers]


def _row_positions(whole: torch.Tensor, kept: torch.Tensor, layer: int, head: int) -> list[int]:
    """The row of ``whole`` (``[tokens, head_dim]``) that each row of ``kept`` equals bit for bit."""
    where = {bytes(row.contiguous().view(torch.uint8).numpy()): i for i, row in enumerate(whole.cpu())}
    out = []
    for row in kept.cpu():
        found = where.get(bytes(row.contiguous().view(torch.uint8).numpy()))
        if found is None:
            raise ValueError(f"layer {layer}, KV head {head}: a kept key matches no key of the uncompressed prefill")
        out.append(found)
    return out


def _masked_positions(model: PreTrainedModel) -> dict[tuple[int, int], set[int]]:
    """``(layer, kv_head)`` → positions a head-wise press masked (kvpress's ``module.masked_key_indices``)."""
    out: dict[tuple[int, int], set[int]] = {}
    for index, layer in enumerate(model.model.layers):
        found = getattr(layer.self_attn, "masked_key_indices", None)
        if found is None:
            continue
        _batch, heads, positions = found
        for h, p in zip(heads.tolist(), positions.tolist(), strict=True):
            out.setdefault((index, int(h)), set()).add(int(p))
        layer.self_attn.masked_key_indices = None
    return out


@dataclass(frozen=True)
class Agreement:
    """How two :data:`Kept` of one prompt compare.

    Attributes
    ----------
    heads
        (layer, KV head) pairs compared.
    same_sets
        Pairs that keep exactly the same positions.
    same_counts
        Pairs that keep as many positions.
    jaccard
        Mean over the pairs of |A ∩ B| / |A ∪ B|.
    first_difference
        The first pair that differs, ``(layer, head, only_a, only_b)`` with a few positions of each, or None.
    """

    heads: int
    same_sets: int
    same_counts: int
    jaccard: float
    first_difference: tuple[int, int, tuple[int, ...], tuple[int, ...]] | None

    @property
    def share(self) -> float:
        """The share of heads whose kept positions agree exactly."""
        return self.same_sets / self.heads if self.heads else 1.0


def agreement(a: Kept, b: Kept, layers: list[int] | None = None) -> Agreement:
    """Head by head comparison of two :data:`Kept` of the same prompt and model, over ``layers`` (default:
    all; :func:`compressed_layers` leaves out sliding-window layers, which neither side compresses)."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} layers against {len(b)}")
    heads = same = counts = 0
    jac = 0.0
    first = None
    for layer, (ra, rb) in enumerate(zip(a, b, strict=True)):
        if layers is not None and layer not in layers:
            continue
        for head, (sa, sb) in enumerate(zip(ra, rb, strict=True)):
            x, y = set(sa), set(sb)
            heads += 1
            same += x == y
            counts += len(x) == len(y)
            jac += len(x & y) / len(x | y) if x | y else 1.0
            if first is None and x != y:
                first = (layer, head, tuple(sorted(x - y))[:5], tuple(sorted(y - x))[:5])
    return Agreement(heads, same, counts, jac / heads if heads else 1.0, first)


def compressed_layers(model: PreTrainedModel) -> list[int]:
    """The layers a cache setting compresses: every layer but the sliding-window ones (Gemma 3's), which keep
    their window under headprobe's settings and kvpress's presses alike."""
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * model.config.num_hidden_layers
    return [i for i, kind in enumerate(types) if kind != "sliding_attention"]
