"""Moving cached keys to other positions: re-rotating post-RoPE keys by a position shift.

A rotary key for position ``p`` is ``R(p·θ) k`` (each pair of dimensions ``(i, i + d/2)`` rotated by
``p·θ_i``, the whole scaled by the module's ``attention_scaling``). Rotations compose, so the key for
position ``p + s`` is ``R(s·θ) R(p·θ) k``: applying the rotation of angle ``s·θ_i`` to the cached key
moves it by ``s`` positions without the hidden state it came from. The angles come from the model's own
rotary module (its ``inv_freq``, which already holds linear, YaRN or Llama-3 scaling) called at position
``s``, divided by the module's ``attention_scaling`` (the key already carries that factor once).

Models with more than one rotary embedding (Gemma 3: local and global layers use different bases) are
handled per layer: :func:`layer_rotation` picks the layer type's parameters.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ..errors import HeadprobeError

#: Rotary types whose ``inv_freq`` depends on the sequence length; a cached key cannot be moved exactly.
_LENGTH_DEPENDENT = ("dynamic", "longrope")


@dataclass(frozen=True)
class LayerRotation:
    """How one layer's keys are rotated: the rotary module and, for per-type modules, the layer type."""

    module: torch.nn.Module
    layer_type: str | None

    @property
    def attention_scaling(self) -> float:
        if self.layer_type is not None and hasattr(self.module, f"{self.layer_type}_attention_scaling"):
            return float(getattr(self.module, f"{self.layer_type}_attention_scaling"))
        return float(getattr(self.module, "attention_scaling", 1.0))

    @property
    def rope_type(self) -> str:
        kind = getattr(self.module, "rope_type", "default")
        if isinstance(kind, dict):
            return kind.get(self.layer_type, "default")
        return kind or "default"

    def cos_sin(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own ``(cos, sin)`` for ``positions`` ``[batch, n]``: ``[batch, n, head_dim]`` each,
        ``attention_scaling`` included (what the attention layer multiplies queries and keys with)."""
        if self.layer_type is not None:
            return self.module(like, positions, self.layer_type)
        return self.module(like, positions)


def decoder_of(model) -> torch.nn.Module:
    """The decoder stack of a causal LM (``model.model`` for Llama, Qwen, Gemma 3 text models)."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return inner
    if hasattr(model, "layers"):
        return model
    raise HeadprobeError(f"{type(model).__name__}: no decoder layers found (expected model.model.layers)")


def layer_rotation(model, layer_idx: int) -> LayerRotation:
    """The rotary embedding of layer ``layer_idx``.

    Raises
    ------
    HeadprobeError
        When the model has no rotary module, or its rotary type depends on the sequence length.
    """
    decoder = decoder_of(model)
    module = getattr(decoder, "rotary_emb", None)
    if module is None:
        raise HeadprobeError(f"{type(model).__name__}: no rotary embedding (rotary_emb); keys cannot be moved")
    layer_type = None
    if "layer_type" in inspect.signature(module.forward).parameters:
        layer_type = decoder.config.layer_types[layer_idx]
    rotation = LayerRotation(module, layer_type)
    if rotation.rope_type in _LENGTH_DEPENDENT:
        raise HeadprobeError(f"rope type {rotation.rope_type!r}: its frequencies depend on the sequence length, "
                             "so cached keys cannot be moved to new positions exactly")
    return rotation


def shift_cos_sin(rotation: LayerRotation, shift: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[head_dim]`` of the pure rotation by ``shift`` positions (no ``attention_scaling``).

    Parameters
    ----------
    rotation
        The layer's rotary embedding.
    shift
        Positions to move by (may be negative).
    like
        A tensor on the device and of the dtype wanted (the keys).
    """
    cos, sin = rotation.cos_sin(torch.tensor([[shift]], device=like.device), like.float())
    scale = rotation.attention_scaling
    return (cos[0, 0] / scale).to(like.dtype), (sin[0, 0] / scale).to(like.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(-x2, x1)`` for ``x = (x1, x2)`` split in halves along the last axis (the rotary pairing)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def shift_keys(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Re-rotate post-RoPE ``keys`` ``[batch, kv_heads, tokens, head_dim]`` by the rotation ``(cos, sin)``
    (from :func:`shift_cos_sin`); returns a new tensor of the same shape."""
    if cos.shape[-1] != keys.shape[-1]:
        raise HeadprobeError(f"rotary dimension {cos.shape[-1]} differs from head_dim {keys.shape[-1]} "
                             "(partial rotary embeddings are not supported)")
    return keys * cos + rotate_half(keys) * sin


def shifted_keys(model, layer_idx: int, keys: torch.Tensor, shift: int) -> torch.Tensor:
    """Keys of layer ``layer_idx`` computed at positions ``p``, moved to ``p + shift``."""
    if shift == 0:
        return keys
    cos, sin = shift_cos_sin(layer_rotation(model, layer_idx), shift, keys)
    return shift_keys(keys, cos, sin)
