"""The shape of a compressed cache: layers, KV heads and each layer's attention type.

Budgets are resolved against this value (not against the cache), and policies read it from their layer
context; it comes from the model's config through :func:`headprobe.models.identity.identity_from_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..models.identity import ModelIdentity, identity_from_config

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class CacheShape:
    """Layers and KV heads of a model's cache.

    Attributes
    ----------
    num_layers, num_kv_heads
        ``[layers, kv_heads]`` segments per batch row.
    layer_types
        One attention type per layer (``"full_attention"``, ``"sliding_attention"``).
    sliding_window
        Window of the sliding-window layers, ``None`` without them.
    """

    num_layers: int
    num_kv_heads: int
    layer_types: tuple[str, ...]
    sliding_window: int | None = None

    @classmethod
    def from_identity(cls, identity: ModelIdentity) -> CacheShape:
        return cls(identity.num_layers, identity.num_kv_heads, tuple(identity.layer_types), identity.sliding_window)

    @classmethod
    def from_config(cls, config: Any) -> CacheShape:
        """The shape of a transformers config (the text config of a multimodal one)."""
        return cls.from_identity(identity_from_config(config, name=str(getattr(config, "name_or_path", "")),
                                                      source="config"))

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == SLIDING

    @property
    def cached_layers(self) -> list[int]:
        """Layers whose cache follows the budgets (every layer but the sliding-window ones)."""
        return [i for i, t in enumerate(self.layer_types) if t != SLIDING]

    @property
    def heads(self) -> int:
        """Segments per batch row (``layers · kv_heads``)."""
        return self.num_layers * self.num_kv_heads
