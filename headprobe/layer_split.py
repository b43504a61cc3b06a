"""A layer split: which layers keep a sliding window of ``W`` tokens and which keep the whole context.

Serving engines take no per-head budgets, but several take per-layer windows (vLLM's ``layer_types`` +
``sliding_window``, TensorRT-LLM's ``max_attention_window`` list + ``sink_token_length``, llama.cpp's
``n_swa`` + per-layer flag). A :class:`LayerSplit` is that deployable form of a budget: per layer
``"global"`` or a window, one sink, the engine it obeys, and the context it was sized at.

File ``{"format": "headprobe.layer_split", "version": 1, "model", "engine", "layers": ["global" | W, ...],
"sink", "context", "dtype", "kept_tokens", "bytes", "full_bytes", "share", "source", "created"}``
(``docs/formats.md``).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import FileFormatError, HeadprobeError
from .files.jsonio import atomic_write_json, read_headprobe_file, require
from .limits import MAX_TOKENS
from .models.identity import ModelIdentity

SPLIT_FORMAT = "headprobe.layer_split"
SPLIT_VERSION = 1
GLOBAL = "global"
#: The engines a split is made for (``docs/interop.md``, "Layer splits").
ENGINES = ("vllm", "tensorrt-llm", "llama.cpp")
#: Bytes of one cached element per dtype name.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1}


def token_bytes(model: ModelIdentity, dtype: str) -> int:
    """Bytes of one token in one layer of ``model``: key and value of every KV head in ``dtype``."""
    return 2 * model.num_kv_heads * model.head_dim * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class LayerSplit:
    """Per layer ``"global"`` (every token) or a window ``W`` (the tokens a local layer attends).

    Attributes
    ----------
    model
        The model the split is for.
    engine
        ``"vllm"``, ``"tensorrt-llm"`` or ``"llama.cpp"``: whose constraints it obeys.
    layers
        ``[layers]`` ``"global"`` or an int ``W``: a local layer attends the first ``sink`` tokens and the
        last ``W - sink`` (the query itself included), as the engine's sliding window does.
    sink
        First tokens every local layer keeps (TensorRT-LLM's ``sink_token_length``; 0 elsewhere).
    context
        The context length (tokens) the split was sized at.
    dtype
        The cached keys' and values' type its bytes are counted in.
    source
        How it was chosen: the profile (kind, fingerprint, path), the layer scores, the target.
    """

    model: ModelIdentity
    engine: str
    layers: tuple[int | str, ...]
    sink: int = 0
    context: int = 4096
    dtype: str = "bfloat16"
    source: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    def __post_init__(self) -> None:
        check_split(self, "<split>")

    @property
    def global_layers(self) -> list[int]:
        return [i for i, w in enumerate(self.layers) if w == GLOBAL]

    @property
    def local_layers(self) -> list[int]:
        return [i for i, w in enumerate(self.layers) if w != GLOBAL]

    def kept_tokens(self, context: int | None = None) -> list[int]:
        """``[layers]`` tokens each KV head of a layer keeps at ``context`` tokens (default: the split's)."""
        n = self.context if context is None else context
        return [n if w == GLOBAL else min(n, int(w)) for w in self.layers]

    def token_bytes(self) -> int:
        """Bytes of one token in one layer: key and value of every KV head."""
        return token_bytes(self.model, self.dtype)

    def kept_bytes(self, context: int | None = None) -> int:
        """Bytes the split keeps at ``context`` tokens (one sequence)."""
        return sum(self.kept_tokens(context)) * self.token_bytes()

    def full_bytes(self, context: int | None = None) -> int:
        """Bytes of a full cache at ``context`` tokens (one sequence)."""
        n = self.context if context is None else context
        return self.model.num_layers * n * self.token_bytes()

    def to_json(self) -> dict[str, Any]:
        kept, full = self.kept_bytes(), self.full_bytes()
        return {"format": SPLIT_FORMAT, "version": SPLIT_VERSION, "model": self.model.to_json(),
                "engine": self.engine, "layers": list(self.layers), "sink": self.sink, "context": self.context,
                "dtype": self.dtype, "kept_tokens": self.kept_tokens(), "bytes": kept, "full_bytes": full,
                "share": round(kept / full, 6), "source": self.source, "created": self.created}

    def save(self, path: str | Path, force: bool = False) -> Path:
        """Write the split, once :meth:`from_json` accepts it; an existing file only with ``force``."""
        obj = self.to_json()
        LayerSplit.from_json(json.loads(json.dumps(obj)), path)
        return atomic_write_json(path, obj, overwrite=force)

    @classmethod
    def from_json(cls, obj: dict, path: object = "<split>") -> LayerSplit:
        model = ModelIdentity.from_json(require(obj, "model", dict, path), path)
        layers = require(obj, "layers", list, path)
        try:
            split = cls(model=model, engine=require(obj, "engine", str, path), layers=tuple(layers),
                        sink=require(obj, "sink", int, path), context=require(obj, "context", int, path),
                        dtype=require(obj, "dtype", str, path), source=dict(obj.get("source") or {}),
                        created=str(obj.get("created", "")))
        except FileFormatError:
            raise
        except HeadprobeError as exc:
            raise FileFormatError(path, "layers", str(exc)) from None
        check_split(split, path)
        return split

    @classmethod
    def in_map(cls, budget_map: Any) -> LayerSplit | None:
        """The split a budget map of ``allocate --method layer_split*`` carries (``method.layer_split``);
        ``None`` for any other map."""
        block = budget_map.method.get("layer_split")
        return cls.from_json(block, "method.layer_split") if isinstance(block, dict) else None

    @classmethod
    def load(cls, path: str | Path) -> LayerSplit:
        """Read and validate a split file."""
        return cls.from_json(read_headprobe_file(path, SPLIT_FORMAT, SPLIT_VERSION), path)


def check_split(split: LayerSplit, path: object) -> None:
    """Refuse a split that is not one: wrong layer count, windows that are not positive integers, a sink
    the windows cannot hold, an unknown engine or dtype.

    Raises
    ------
    FileFormatError
        Naming the field and what was expected.
    """
    m = split.model
    if split.engine not in ENGINES:
        raise FileFormatError(path, "engine", f"expected one of {', '.join(ENGINES)}, found {split.engine!r}")
    if split.dtype not in DTYPE_BYTES:
        raise FileFormatError(path, "dtype", f"expected one of {', '.join(DTYPE_BYTES)}, found {split.dtype!r}")
    if len(split.layers) != m.num_layers:
        raise FileFormatError(path, "layers", f"expected {m.num_layers} entries (one per layer), found "
                                              f"{len(split.layers)}")
    if not 1 <= split.context <= MAX_TOKENS or isinstance(split.context, bool):
        raise FileFormatError(path, "context", f"expected a positive token count, found {split.context!r}")
    if split.sink < 0 or isinstance(split.sink, bool):
        raise FileFormatError(path, "sink", f"expected 0 or more tokens, found {split.sink!r}")
    for i, w in enumerate(split.layers):
        if w == GLOBAL:
            continue
        if not isinstance(w, int) or isinstance(w, bool) or not split.sink < w <= MAX_TOKENS:
            raise FileFormatError(path, f"layers[{i}]", f"expected \"global\" or a window larger than the sink "
                                                        f"({split.sink}), found {w!r}")


__all__ = ("DTYPE_BYTES", "ENGINES", "GLOBAL", "SPLIT_FORMAT", "SPLIT_VERSION", "LayerSplit", "check_split",
           "token_bytes")
