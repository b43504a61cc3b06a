"""The grid runner: every setting × length × depth cell, every item in each cell, logged cell by cell.

Finished cells go to a JSONL cell log (``<out>.cells.jsonl``, the trial-log format of
:mod:`headprobe.files.trial_log`, one cell a line); the result JSON is rewritten atomically after
each cell. An interrupted run resumes from the last finished cell and never redoes one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..errors import HeadprobeError
from ..files.trial_log import TrialLog
from ..haystack.context import TrialContext, build_context
from ..haystack.corpus import Haystack
from ..models.identity import text_config
from .answer_scores import score_answer
from .items import EvalItem
from .result import EvalResult
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
    share_prefill
        Run each prompt's forward once for every setting whose policy prefills with plain attention
        (:mod:`headprobe.runtime.shared_prefill`; same answers and bytes, far less time); KeyDiff's
        block-wise prefill always runs on its own.
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
    share_prefill: bool = True


def model_context(lm: Any) -> int | None:
    cfg = lm.model.config
    cfg = text_config(cfg)
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
              max_new_tokens: int, prefill: Any = None, reference: str | None = None) -> dict[str, Any]:
    """One generation with the setting's cache; the answer, its score, bytes and time.

    With ``prefill`` (a :class:`~headprobe.runtime.RecordedPrefill` of this prompt) the prompt forward is
    not run again; the time reported still includes it, as if this setting had run alone. ``reference``
    is the full cache's answer, which ``fidelity`` items are scored against; the ``full`` setting's own
    answer is that reference when none is given.
    """
    from ..runtime import generate_compressed, generate_from_prefill

    start = time.perf_counter()
    if prefill is None:
        res = generate_compressed(lm, input_ids=torch.tensor([context.input_ids]), policy=setting.policy,
                                  budget=budget, policy_options=setting.options or None,
                                  max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - start
    else:
        res = generate_from_prefill(lm, prefill, policy=setting.policy, budget=budget,
                                    policy_options=setting.options or None, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - start + prefill.seconds
    text = res.texts[0]
    eos = lm.tokenizer.eos_token_id
    new = [t for t in res.new_tokens[0].tolist() if t != lm.tokenizer.pad_token_id]
    n_new = len(new) if eos is None or eos not in new else new.index(eos) + 1
    extra: dict[str, Any] = {}
    if item.scorer == "fidelity":
        if reference is None and setting.policy == "full":
            reference = text
        if reference is None:
            raise HeadprobeError(f"item {item.id}: fidelity scoring needs the full cache's answer")
        extra = {"reference": reference, "needle_recall": round(score_answer(text, item.gold, "rouge"), 4)}
        score = score_answer(text, reference, "fidelity")
    else:
        score = score_answer(text, item.gold, item.scorer, item.choices)
    return {
        "item": item.id, "prompt_len": context.length, "answer_span": list(context.answer_span),
        "actual_depth": round(context.actual_depth, 4), "response": text, "gold": item.gold,
        "score": score, **extra,
        **cache_measurements(res, seconds), "new_tokens": max(n_new, 1), "shared_prefill": prefill is not None,
    }


def cache_measurements(res: Any, seconds: float) -> dict[str, Any]:
    """A trial's real cache bytes (allocated, held, a full cache's) and its wall time."""
    return {"cache_bytes": int(res.cache.memory_bytes()), "used_bytes": int(res.cache.used_bytes()),
            "full_cache_bytes": int(res.cache.full_cache_bytes()), "seconds": round(seconds, 4)}


def shares_prefill(setting: EvalSetting) -> bool:
    """Whether the setting's policy prefills with plain attention (one recorded forward serves it)."""
    from ..runtime import POLICIES

    return bool(POLICIES[setting.policy].full_prefill)


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
    from ..runtime import record_prefill

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
    for L in request.lengths:
        for d in request.depths:
            todo = []
            for s in request.settings:
                cid = cell_id(s, L, d)
                if cid in log:
                    result.cells.append(log.done[cid])
                    if progress:
                        progress(len(request.items))
                else:
                    todo.append(s)
            if not todo:
                continue
            # Items outer, settings inner: one recorded prompt forward at a time serves every sharing setting.
            # The cells of (L, d) are logged together once all their items are done.
            share = request.share_prefill and sum(shares_prefill(s) for s in todo) > 1
            trials: dict[str, list[dict[str, Any]]] = {s.label: [] for s in todo}
            for item in request.items:
                ctx = context(item, L, d)
                prefill = record_prefill(lm, input_ids=torch.tensor([ctx.input_ids])) if share else None
                reference = None
                if item.scorer == "fidelity" and not any(s.policy == "full" for s in todo):
                    # the full cache's answer, which the others are scored against, when no setting gives it
                    reference = run_trial(lm, ctx, item, EvalSetting("reference", "full"), None,
                                          request.max_new_tokens, prefill=prefill)["response"]
                for s in sorted(todo, key=lambda s: s.policy != "full"):     # the full cache first: the reference
                    use = prefill if prefill is not None and shares_prefill(s) else None
                    trial = run_trial(lm, ctx, item, s, budgets[s.label], request.max_new_tokens, prefill=use,
                                      reference=reference)
                    trials[s.label].append(trial)
                    if item.scorer == "fidelity" and reference is None:
                        reference = trial["response"]
                    if progress:
                        progress(1)
                del prefill
            for s in todo:
                record = _cell_record(s, L, d, trials[s.label])
                log.append(record)
                result.cells.append(record)
            result.save(out)
    result.complete = True
    result.save(out)
    return result
