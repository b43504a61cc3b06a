"""What one engine holds for one budget: the row every engine module returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...models.identity import ModelIdentity
from ..setting import Setting

#: ``stored`` values: each KV head once, or each query head (a GQA group's KV head stored once per query head).
STORED = ("kv_head", "query_head")


@dataclass
class EngineAllocation:
    """What an engine allocates for a budget at a :class:`~headprobe.explain.setting.Setting`.

    Token arrays are per sequence of the batch (every sequence has the same context); bytes are for the
    whole batch and count the cached keys and values (headprobe's runtime: every buffer its store
    allocates, see :mod:`~headprobe.explain.engines.headprobe_runtime`).

    Attributes
    ----------
    engine
        ``"headprobe"``, ``"kvpress"``, ``"HeadKV"``, ``"KVCache-Factory"`` or ``"DuoAttention"``.
    setting
        How the engine is run for this budget, in its own terms (``"--max_capacity_prompts 120 --head_beta 1.2"``).
    runs
        ``False`` when the engine cannot run this budget at this setting; ``notes[0]`` says why and the
        arrays and bytes are ``None``.
    stored
        ``"kv_head"`` or ``"query_head"`` (see :data:`STORED`): what one row of ``held`` is.
    held
        ``int64 [layers][stored heads]`` tokens in memory when prefill ends.
    held_end
        ``int64 [layers][stored heads]`` tokens in memory after decoding (``max_new_tokens - 1`` appended).
    attended
        ``int64 [layers][stored heads]`` tokens attention reads after prefill: ``held`` unless the engine
        masks keys instead of freeing them.
    bytes_prefill, bytes_end
        Bytes allocated for the cache when prefill ends and after decoding (preallocated room included).
    frees_memory
        Whether the tokens the budget drops leave memory (``False`` for engines that mask them).
    notes
        What a user must know (one sentence each).
    cites
        Where the arithmetic comes from: ``"owner/repo@commit path:line"`` entries.
    extra
        Engine-specific numbers reported in the JSON (kvpress' reported ``compression_ratio``, ...).
    """

    engine: str
    setting: str
    runs: bool = True
    stored: str = "kv_head"
    held: np.ndarray | None = None
    held_end: np.ndarray | None = None
    attended: np.ndarray | None = None
    bytes_prefill: int | None = None
    bytes_end: int | None = None
    frees_memory: bool = True
    notes: list[str] = field(default_factory=list)
    cites: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def cannot_run(cls, engine: str, setting: str, why: str, cites: list[str] | None = None) -> EngineAllocation:
        """A row for an engine that cannot run the budget (``why``: one sentence)."""
        return cls(engine, setting, runs=False, notes=[why], cites=list(cites or []))

    def tokens(self, which: str = "held") -> int | None:
        """Total tokens of ``held``, ``held_end`` or ``attended`` for one sequence."""
        arr = getattr(self, which)
        return None if arr is None else int(np.asarray(arr).sum())

    def to_json(self) -> dict[str, Any]:
        def matrix(a):
            return None if a is None else np.asarray(a, dtype=np.int64).tolist()

        return {"engine": self.engine, "setting": self.setting, "runs": self.runs, "stored": self.stored,
                "frees_memory": self.frees_memory if self.runs else None,
                "tokens_held": self.tokens("held"), "tokens_held_end": self.tokens("held_end"),
                "tokens_attended": self.tokens("attended"), "bytes_prefill": self.bytes_prefill,
                "bytes_end": self.bytes_end, "held": matrix(self.held), "held_end": matrix(self.held_end),
                "attended": matrix(self.attended), "notes": list(self.notes), "cites": list(self.cites),
                **({"extra": self.extra} if self.extra else {})}


def kv_bytes(tokens: np.ndarray, model: ModelIdentity, setting: Setting) -> int:
    """Bytes of the keys and values of ``tokens`` (summed over heads) for the whole batch."""
    return int(np.asarray(tokens, dtype=np.int64).sum()) * setting.token_bytes(model.head_dim) * setting.batch


def dynamic(engine: str, setting_text: str, held: np.ndarray, model: ModelIdentity, setting: Setting, *,
            stored: str = "kv_head", attended: np.ndarray | None = None, frees_memory: bool = True,
            held_end: np.ndarray | None = None, notes: list[str] | None = None,
            cites: list[str] | None = None) -> EngineAllocation:
    """A row for an engine whose cache holds exactly its tokens (tensors concatenated as they grow): bytes are
    the keys and values of ``held`` after prefill and of ``held_end`` (default ``held + M - 1``) after decoding."""
    held = np.asarray(held, dtype=np.int64)
    end = held + setting.appended if held_end is None else np.asarray(held_end, dtype=np.int64)
    return EngineAllocation(engine, setting_text, True, stored, held, end,
                            held.copy() if attended is None else np.asarray(attended, dtype=np.int64),
                            kv_bytes(held, model, setting), kv_bytes(end, model, setting), frees_memory,
                            list(notes or []), list(cites or []))


__all__ = ("STORED", "EngineAllocation", "dynamic", "kv_bytes")
