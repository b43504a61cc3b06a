"""The model identity block that every profile and budget file records."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..errors import FileFormatError, ModelMismatchError
from ..files.jsonio import fingerprint

#: Fields that decide whether a file made on one model can be applied to another.
SHAPE_FIELDS = ("architecture", "num_layers", "num_query_heads", "num_kv_heads", "head_dim", "layer_types")


@dataclass(frozen=True)
class ModelIdentity:
    """What a profile or budget was computed on.

    Attributes
    ----------
    name
        Canonical model name, a Hugging Face id where there is one
        (``"HuggingFaceTB/SmolLM2-135M-Instruct"``).
    source
        Where the weights came from: ``"gguf:<package>/<file>"``, ``"hub:<id>"``, ``"local:<dir>"`` or
        ``"import:<file>"``.
    architecture
        ``config.model_type`` (``"llama"``, ``"gemma3_text"``, ...).
    num_layers, num_query_heads, num_kv_heads, head_dim
        Attention shape; ``num_query_heads // num_kv_heads`` query heads share one KV head.
    layer_types
        One entry per layer: ``"full_attention"`` or ``"sliding_attention"``.
    sliding_window
        Window of the sliding layers in tokens, ``None`` when the model has none.
    max_context
        ``config.max_position_embeddings``.
    """

    name: str
    source: str
    architecture: str
    num_layers: int
    num_query_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...] = field(default_factory=tuple)
    sliding_window: int | None = None
    max_context: int | None = None

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.num_query_heads // self.num_kv_heads

    @property
    def fingerprint(self) -> str:
        """Hash of the name and the shape fields (not of the source: the same model from a GGUF or
        from the hub fits the same files)."""
        return fingerprint({"name": self.name, **{k: _jsonable(getattr(self, k)) for k in SHAPE_FIELDS}})

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["layer_types"] = list(self.layer_types)
        out["fingerprint"] = self.fingerprint
        return out

    @classmethod
    def from_json(cls, obj: Any, path: object = "<model>", prefix: str = "model") -> ModelIdentity:
        if not isinstance(obj, dict):
            raise FileFormatError(path, prefix, "expected an object with the model identity")
        ints = ("num_layers", "num_query_heads", "num_kv_heads", "head_dim")
        for key in ("name", "source", "architecture", *ints, "layer_types"):
            if key not in obj:
                raise FileFormatError(path, f"{prefix}.{key}", "missing")
        for key in ints:
            if not isinstance(obj[key], int) or obj[key] <= 0:
                raise FileFormatError(path, f"{prefix}.{key}", f"expected a positive integer, found {obj[key]!r}")
        layer_types = obj["layer_types"]
        if not isinstance(layer_types, list) or len(layer_types) != obj["num_layers"]:
            raise FileFormatError(path, f"{prefix}.layer_types", f"expected a list of {obj['num_layers']} layer types")
        if obj["num_query_heads"] % obj["num_kv_heads"]:
            raise FileFormatError(path, f"{prefix}.num_query_heads", "expected a multiple of num_kv_heads")
        return cls(
            name=str(obj["name"]), source=str(obj["source"]), architecture=str(obj["architecture"]),
            num_layers=obj["num_layers"], num_query_heads=obj["num_query_heads"],
            num_kv_heads=obj["num_kv_heads"], head_dim=obj["head_dim"],
            layer_types=tuple(str(t) for t in layer_types),
            sliding_window=obj.get("sliding_window"), max_context=obj.get("max_context"),
        )

    def differences(self, other: ModelIdentity, include_name: bool = True) -> list[str]:
        """Human-readable list of the fields in which ``other`` differs from ``self``."""
        fields = (("name",) if include_name else ()) + SHAPE_FIELDS
        out = []
        for key in fields:
            a, b = getattr(self, key), getattr(other, key)
            if a != b:
                if key == "layer_types":
                    out.append("layer_types differ")
                else:
                    out.append(f"{key} {a!r} vs {b!r}")
        return out

    def check_fits(self, model: ModelIdentity, what: str = "file", include_name: bool = True) -> None:
        """Raise :class:`ModelMismatchError` if a file made on ``self`` cannot be applied to ``model``."""
        diffs = self.differences(model, include_name=include_name)
        if diffs:
            raise ModelMismatchError(
                f"{what} was made for {self.name} but the model is {model.name}: " + "; ".join(diffs)
            )


class HasIdentity(Protocol):
    """A model as far as its shape is read (a budget resolved, a file checked against it): a
    :class:`~headprobe.LoadedModel`, or its identity alone before it loads
    (:class:`~headprobe.tune.space_check.ShapeOnly`)."""

    @property
    def identity(self) -> ModelIdentity: ...


def text_config(config: Any) -> Any:
    """The text part of a transformers config (multimodal models nest it; text models are their own)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def identity_from_config(config: Any, name: str, source: str) -> ModelIdentity:
    """Build a :class:`ModelIdentity` from a transformers config (text config of multimodal models)."""
    cfg = text_config(config)
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    layer_types = getattr(cfg, "layer_types", None)
    sliding = getattr(cfg, "sliding_window", None)
    if not layer_types:
        if sliding and getattr(cfg, "use_sliding_window", True) is not False and cfg.model_type in ("mistral",):
            layer_types = ["sliding_attention"] * layers
        else:
            layer_types = ["full_attention"] * layers
    if "sliding_attention" not in layer_types:
        sliding = None
    return ModelIdentity(
        name=name, source=source, architecture=str(cfg.model_type), num_layers=layers,
        num_query_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        layer_types=tuple(str(t) for t in layer_types), sliding_window=int(sliding) if sliding else None,
        max_context=int(getattr(cfg, "max_position_embeddings", 0) or 0) or None,
    )


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
