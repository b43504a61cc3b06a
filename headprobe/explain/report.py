"""The terminal report of an :class:`~headprobe.explain.explanation.Explanation`."""

from __future__ import annotations

import numpy as np

from .explanation import Explanation
from .setting import format_bytes


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def budget_lines(ex: Explanation) -> list[str]:
    """One line per layer: tokens per KV head, the layer's tokens and bytes; then the total."""
    b = np.asarray(ex.budget, dtype=np.int64)
    width = max(len(str(int(b.max()))), 3)
    cells = " ".join([f"{{:>{width}}}"] * b.shape[1])
    head_w = max(len(cells.format(*b[0])), len("tokens per KV head"))
    lines = [f"layer  {'tokens per KV head':<{head_w}}  {'tokens':>10}  {'bytes':>11}"]
    per_layer_bytes = ex.budget_bytes.sum(axis=1)
    for i, row in enumerate(b):
        kind = " (sliding)" if ex.model.layer_types[i] == "sliding_attention" else ""
        lines.append(f"{i:>5}  {cells.format(*row):<{head_w}}  {int(row.sum()):>10,}  "
                     f"{format_bytes(per_layer_bytes[i]):>11}{kind}")
    total, nbytes = int(b.sum()), int(ex.budget_bytes.sum())
    share = total / ex.full_tokens()
    lines.append(f"total  {'':<{head_w}}  {total:>10,}  {format_bytes(nbytes):>11}  {share:.1%} of a "
                 f"full cache ({ex.full_tokens():,} tokens, {format_bytes(ex.full_bytes())})")
    return lines


def engine_lines(ex: Explanation) -> list[str]:
    """Per engine: stored heads, tokens held and attended, bytes after prefill and at the end, share of full."""
    lines = [(f"{'engine':<16} {'stores':<12} {'held':>11} {'attended':>11} {'prefill':>11} {'end':>11} "
             f"{'of full (end)':>13}")]
    for e in ex.engines:
        if not e.runs:
            lines.append(f"{e.engine:<16} cannot run: {e.notes[0]}")
            lines.append(f"{'':<16} {e.setting}")
            continue
        stored = "query heads" if e.stored == "query_head" else "KV heads"
        lines.append(f"{e.engine:<16} {stored:<12} {e.tokens('held'):>11,} {e.tokens('attended'):>11,} "
                     f"{format_bytes(e.bytes_prefill):>11} {format_bytes(e.bytes_end):>11} "
                     f"{_pct(ex.share(e.bytes_end, True)):>13}")
        lines.append(f"{'':<16} {e.setting}")
        lines.extend(f"{'':<16} - {note}" for note in e.notes)
    return lines


def format_explanation(ex: Explanation) -> str:
    """The whole report: model and setting, the budget per layer and KV head, then the engines."""
    m, s = ex.model, ex.setting
    sliding = (f", {m.layer_types.count('sliding_attention')} sliding-window layers (window {m.sliding_window})"
               if "sliding_attention" in m.layer_types else "")
    lines = [
        (f"model    {m.name}: {m.num_layers} layers x {m.num_kv_heads} KV heads ({m.num_query_heads} query heads), "
        f"head_dim {m.head_dim}{sliding}"),
        (f"setting  context {s.context:,} tokens, batch {s.batch}, {s.dtype} ({ex.token_bytes} B a token a KV head, "
        f"key and value), {s.max_new_tokens} new tokens ({s.appended} appended to the cache)"),
        f"input    {ex.source['description']}",
        "",
        (f"the budget at {s.context:,} tokens, per layer and KV head (what headprobe's runtime keeps for it; bytes for "
        "the whole batch):"),
        *budget_lines(ex),
        "",
        (f"what each engine allocates (tokens per sequence; bytes for the whole batch, keys and values; end = after "
        f"{s.max_new_tokens} new tokens; full cache at the end {format_bytes(ex.full_bytes(True))}):"),
        *engine_lines(ex),
    ]
    if ex.notes:
        lines += ["", "notes:", *(f"  - {n}" for n in ex.notes)]
    return "\n".join(lines)


__all__ = ("budget_lines", "engine_lines", "format_explanation")
