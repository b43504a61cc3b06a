"""The grid runner: every setting × length × depth cell, every item in each cell, logged cell by cell.

Finished cells go to a JSONL cell log (``<out>.cells.jsonl``, the trial-log format of
:mod:`headprobe.probes.triallog`, one cell a line); the result JSON is rewritten atomically after
each cell. An interrupted run resumes from the last finished cell and never redoes one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import HeadprobeError
from ..haystack.context import TrialContext, build_context
from ..haystack.corpus import Haystack
from ..probes.triallog import TrialLog
from .items import EvalItem
from .result import EvalResult
from .scoring import score_answer
from .settings import EvalSetting


@dataclass
class EvalRequest:
    """What to run.

    Attributes
    ----------
    settings
        From :func:`headprobe.eval.settings.expand_settings`.
    items
        The questions asked in every cell.
    lengths, depths
        The grid: prompt lengths in tokens, needle depths in [0, 1].
    haystack
        The text the needles are hidden in.
    task
        Description written into the result (kind, needle file, fingerprints).
    """

    settings: list[EvalSetting]
    items: list[EvalItem]
    lengths: list[int]
    depths: list[float]
    haystack: Haystack
    task: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 24
    chat_template: bool = True
    profile_dirs: list[Path] | None = None


def model_context(lm: Any) -> int | None:
    cfg = lm.model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, "max_position_embeddings", None)


def resolve_budget(lm: Any, setting: EvalSetting, profile_dirs: list[Path] | None = None) -> Any:
    """The ``budget`` argument of :func:`generate_compressed` for a setting: a capacity or a budget map.

    Raises
    ------
    HeadprobeError
        A profile that is missing or made for another model, or a capacity the allocator refuses.
    """
    from ..allocation import allocate, load_profile, newest_profile

    if setting.capacity is None or setting.allocation in (None, "uniform"):
        return setting.capacity
    profiles = []
    for p in setting.profiles:
        if Path(p).is_file():
            profiles.append(load_profile(p))
        else:
            profiles.append(newest_profile(lm.identity, p, profile_dirs).profile)
    try:
        return allocate(setting.allocation, profiles, lm.identity, capacity=setting.capacity)
    except HeadprobeError as exc:
        raise HeadprobeError(f"setting {setting.label}: {exc}") from None


def run_trial(lm: Any, context: TrialContext, item: EvalItem, setting: EvalSetting, budget: Any,
              max_new_tokens: int) -> dict[str, Any]:
    """One generate call with the setting's cache; the answer, its score, bytes and time."""
    from ..runtime import generate_compressed

    ids = torch.tensor([context.input_ids])
    start = time.perf_counter()
    res = generate_compressed(lm, input_ids=ids, policy=setting.policy, budget=budget,
                              policy_options=setting.options or None, max_new_tokens=max_new_tokens)
    seconds = time.perf_counter() - start
    text = res.texts[0]
    eos = lm.tokenizer.eos_token_id
    new = [t for t in res.new_tokens[0].tolist() if t != lm.tokenizer.pad_token_id]
    n_new = len(new) if eos is None or eos not in new else new.index(eos) + 1
    return {
        "item": item.id, "prompt_len": context.length, "answer_span": list(context.answer_span),
        "actual_depth": round(context.actual_depth, 4), "response": text, "gold": item.gold,
        "score": score_answer(text, item.gold, item.scorer, item.choices),
        "cache_bytes": int(res.cache.memory_bytes()), "used_bytes": int(res.cache.used_bytes()),
        "full_cache_bytes": int(res.cache.full_cache_bytes()), "seconds": round(seconds, 4),
        "new_tokens": max(n_new, 1),
    }


def cell_id(setting: EvalSetting, length: int, depth: float | None) -> str:
    return f"{setting.label}|{length}|{depth:g}" if depth is not None else f"{setting.label}|{length}|-"


def _cell_record(setting: EvalSetting, length: int, depth: float, trials: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(trials)
    tokens = sum(t["new_tokens"] for t in trials)
    return {
        "trial": cell_id(setting, length, depth), "setting": setting.label, "length": length, "depth": depth,
        "accuracy": sum(t["score"] for t in trials) / n, "n": n,
        "cache_bytes": sum(t["cache_bytes"] for t in trials) / n,
        "used_bytes": sum(t["used_bytes"] for t in trials) / n,
        "full_cache_bytes": sum(t["full_cache_bytes"] for t in trials) / n,
        "ms_per_token": 1000.0 * sum(t["seconds"] for t in trials) / max(tokens, 1),
        "trials": trials,
    }


def cell_log_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.stem + ".cells.jsonl")


def run_eval(lm: Any, request: EvalRequest, out: str | Path, resume: bool = False, force: bool = False,
             progress: Callable[[int], None] | None = None) -> EvalResult:
    """Run the grid and write ``out`` (result JSON) and its cell log.

    Parameters
    ----------
    lm
        A :class:`~headprobe.LoadedModel`.
    request
        Settings, items and grid.
    out
        The result JSON path; the cell log sits beside it (``<stem>.cells.jsonl``).
    resume, force
        Continue an existing cell log (same settings), or start over.
    progress
        Called with the number of trials just finished.

    Raises
    ------
    HeadprobeError
        Settings that do not fit the model, lengths beyond its context or the haystack, an existing log
        without ``resume``/``force``, or a log made with other settings.
    """
    from .. import __version__

    if not request.items:
        raise HeadprobeError("no questions to ask (empty needle file or --limit 0)")
    if not request.lengths or not request.depths:
        raise HeadprobeError("--lengths and --depths: give at least one of each")
    max_ctx = model_context(lm)
    budgets = {s.label: resolve_budget(lm, s, request.profile_dirs) for s in request.settings}
    contexts: dict[tuple[str, int, float], TrialContext] = {}

    def context(item: EvalItem, length: int, depth: float) -> TrialContext:
        key = (item.id, length, depth)
        if key not in contexts:
            contexts[key] = build_context(lm.tokenizer, request.haystack, item.needle, length, depth,
                                          request.chat_template, max_ctx, question=item.question)
        return contexts[key]

    for length in request.lengths:   # fail before any trial on lengths the model or haystack cannot hold
        context(request.items[0], length, request.depths[0])
    log_settings = {
        "model": lm.identity.fingerprint, "task": request.task, "haystack": request.haystack.fingerprint,
        "items": [i.id for i in request.items], "lengths": list(request.lengths), "depths": list(request.depths),
        "settings": [s.to_json() for s in request.settings], "max_new_tokens": request.max_new_tokens,
        "chat_template": request.chat_template, "headprobe_version": __version__,
    }
    log = TrialLog(cell_log_path(out), log_settings, resume=resume, force=force)
    result = EvalResult(model=lm.identity.to_json(), task=request.task,
                        grid={"lengths": list(request.lengths), "depths": list(request.depths)},
                        settings=[s.to_json() for s in request.settings], cells=[],
                        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        headprobe_version=__version__)
    order = [(s, L, d) for L in request.lengths for d in request.depths for s in request.settings]
    for s, L, d in order:
        cid = cell_id(s, L, d)
        if cid in log:
            result.cells.append(log.done[cid])
            if progress:
                progress(len(request.items))
            continue
        trials = []
        for item in request.items:
            trials.append(run_trial(lm, context(item, L, d), item, s, budgets[s.label], request.max_new_tokens))
            if progress:
                progress(1)
        record = _cell_record(s, L, d, trials)
        log.append(record)
        result.cells.append(record)
        result.save(out)
    result.complete = True
    result.save(out)
    return result
