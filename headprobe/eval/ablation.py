"""Head ablation (Wu et al.'s check that retrieval heads are real): mask chosen query heads.

A masked head attends uniformly to every key it may see (causal, sliding window, padding), so it still
outputs something of the right scale but can no longer pick out the needle. :class:`HeadAblation` is an
:class:`~headprobe.attention.registry.AttentionSwitch`: it registers an attention implementation
(``"headprobe_ablate"``) with transformers' ``AttentionInterface`` and switches the model to it inside
the ``with`` block only; nothing is patched at import time. Unmasked heads go through the stock SDPA
kernel unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import __version__
from ..attention.registry import AttentionSwitch
from ..attention.rows import masked_attention
from ..errors import HeadprobeError, param
from ..files.jsonio import read_json
from ..files.overwrite import check_rerun_outputs
from ..files.trial_log import TrialLog, read_log_records
from ..haystack.context import build_context
from ..haystack.prompt_format import prompt_format_of
from ..head_ranking import top_heads
from ..limits import check_count
from ..models.identity import ModelIdentity, identity_from_config
from ..models.loading import transformers_model
from ..models.placement import input_device
from .answer_scores import score_answer

if TYPE_CHECKING:
    from ..models.loading import LoadedModel, ModelLike

IMPLEMENTATION = "headprobe_ablate"


def _allowed(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
             sliding_window: int | None) -> torch.Tensor:
    """``[batch or 1, 1, n, k]`` boolean: which keys each query row may attend to."""
    n, k = query.shape[2], key.shape[2]
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :k]
        return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    q_pos = torch.arange(k - n, k, device=query.device)[:, None]
    k_pos = torch.arange(k, device=query.device)[None, :]
    allowed = k_pos <= q_pos
    if sliding_window:
        allowed &= k_pos > q_pos - sliding_window
    return allowed[None, None]


def _uniform(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[batch or 1, 1, n, k]`` uniform attention over the keys each row may see."""
    return allowed.to(dtype) / allowed.sum(-1, keepdim=True).clamp(min=1)


def _ablate_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Stock SDPA for every head, then uniform attention for the masked heads of this layer.

    ``query [b, H, n, d]``, ``key``/``value [b, Hkv, k, d]``; returns ``([b, n, H, d], weights or None)``.
    """
    # transformers loads here, on first use: importing this module costs torch only
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    state = HeadAblation.active()
    heads = state.by_layer.get(int(module.layer_idx), []) if state is not None else []
    groups = query.shape[1] // key.shape[1]
    sliding = kwargs.get("sliding_window")
    if state is not None and state.return_weights:
        allowed = _allowed(query, key, attention_mask, sliding)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        weights = masked_attention(query, key, None, allowed, scale, softcap=kwargs.get("softcap")).to(query.dtype)
        if heads:
            weights[:, heads] = _uniform(allowed, query.dtype).expand(weights.shape[0], len(heads), -1, -1)
        out = torch.matmul(weights, repeat_kv(value, groups)).transpose(1, 2).contiguous()
        return out, weights
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                    **kwargs)
    if heads:
        uniform = _uniform(_allowed(query, key, attention_mask, sliding), value.dtype)   # [b|1, 1, n, k]
        kv = torch.tensor([h // groups for h in heads], device=value.device)
        vals = value.index_select(1, kv)                                                # [b, m, k, d]
        masked = torch.matmul(uniform, vals)                                            # [b, m, n, d]
        out = out.clone()
        out[:, :, heads] = masked.transpose(1, 2).to(out.dtype)
    return out, None


def _identity(model: ModelLike) -> ModelIdentity:
    """The identity of a :class:`~headprobe.LoadedModel`, or of a bare transformers model's config."""
    identity = getattr(model, "identity", None)
    if isinstance(identity, ModelIdentity):
        return identity
    config = transformers_model(model).config
    return identity_from_config(config, str(getattr(config, "name_or_path", "") or "model"), "memory")


class HeadAblation(AttentionSwitch, implementation=IMPLEMENTATION):
    """Context manager that masks query heads ``(layer, head)`` of ``model``.

    Parameters
    ----------
    model
        A transformers model (or a :class:`~headprobe.LoadedModel`).
    heads
        ``(layer, query_head)`` pairs to make uniform.
    return_weights
        Compute attention eagerly and return the weights (``output_attentions=True`` then shows them);
        for checks, slower.

    Raises
    ------
    HeadprobeError
        A head outside the model.
    """

    attention = staticmethod(_ablate_attention)

    def __init__(self, model: ModelLike, heads: Iterable[tuple[int, int]], return_weights: bool = False) -> None:
        super().__init__(transformers_model(model))
        identity = _identity(model)
        layers, qheads = identity.num_layers, identity.num_query_heads
        self.heads = sorted({(int(l), int(h)) for l, h in heads})
        for l, h in self.heads:
            if not (0 <= l < layers and 0 <= h < qheads):
                raise HeadprobeError(f"head {l}-{h}: outside the model ({layers} layers × {qheads} query heads)")
        self.by_layer: dict[int, list[int]] = {}
        for l, h in self.heads:
            self.by_layer.setdefault(l, []).append(h)
        self.return_weights = return_weights


def random_heads(shape: tuple[int, int], k: int, seed: int = 0,
                 exclude: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """``k`` random ``(layer, head)`` drawn without replacement, none of ``exclude``."""
    pool = [(l, h) for l in range(shape[0]) for h in range(shape[1]) if (l, h) not in set(exclude)]
    if k > len(pool):
        raise HeadprobeError(f"{param('k', k)}: more heads than the model has to draw from ({len(pool)})")
    return sorted(random.Random(seed).sample(pool, k))


def needle_accuracy(lm: LoadedModel, items: list, contexts: list, heads: list[tuple[int, int]],
                    max_new_tokens: int = 24, progress: Callable[[int], None] | None = None) -> tuple[float, list]:
    """Mean score of greedy answers with ``heads`` masked (stock cache); ``contexts`` pairs with ``items``."""
    model = lm.model
    tok = lm.tokenizer
    out = []
    with HeadAblation(lm, heads), torch.no_grad():
        for item, ctx in zip(items, contexts, strict=True):
            ids = torch.tensor([ctx.input_ids], device=input_device(model))
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
            text = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
            out.append({"item": item.id, "length": ctx.target_length, "depth": ctx.depth, "response": text,
                        "score": score_answer(text, item.gold, item.scorer, item.choices)})
            if progress:
                progress(1)
    return float(np.mean([t["score"] for t in out])), out


def ablation_log_path(out: str | Path) -> Path:
    """``<dir>/<stem>.runs.jsonl``: the run log beside an ablation result ``out``."""
    out = Path(out)
    return out.with_name(out.stem + ".runs.jsonl")


def check_ablation_outputs(out: str | Path, figures: Iterable[str | Path] = (), resume: bool = False,
                           force: bool = False) -> None:
    """Refuse, before any model loads, an ablation that would replace what an earlier one left.

    An existing run log (:func:`ablation_log_path`) needs ``resume`` or ``force``; an existing result or
    figure needs ``force``, except that with ``resume`` the result the log made (same model, profile,
    heads, grid and seed) and the figures it lists (``figures``) are rewritten.
    """

    def figures_of_own_result(out: Path, log: Path) -> list[Any] | None:
        own = _result_made_by_log(out, log)
        return None if own is None else list(own.get("figures") or [])

    check_rerun_outputs(out, ablation_log_path(out), figures, resume, force, figures_of_own_result, "run log")


def _result_made_by_log(out: Path, log: Path) -> dict[str, Any] | None:
    if not (out.is_file() and log.is_file()):
        return None
    try:
        settings, _ = read_log_records(log)
        result = read_json(out)
    except (HeadprobeError, OSError):
        return None
    if not isinstance(result, dict) or result.get("format") != "headprobe.ablation":
        return None
    grid = result.get("grid") or {}
    same = ((result.get("model") or {}).get("fingerprint") == settings.get("model")
            and result.get("profile_fingerprint") == settings.get("profile") and result.get("seed") == settings.get("seed")
            and [r.get("k") for r in result.get("rows", [])] == settings.get("ks")
            and all(grid.get(k) == settings.get(k) for k in ("lengths", "depths", "items")))
    return result if same else None


@dataclass
class AblationPlan:
    """What an ablation runs: the needle prompts every run answers, and the runs.

    Attributes
    ----------
    items, contexts
        The questions and their prompts, paired (length outer, depth, item inner).
    runs
        Run id → the ``(layer, query_head)`` pairs it masks, in run order: ``baseline`` (none), then
        ``top-k`` and ``random-k`` for each k.
    ks
        The numbers of heads masked.
    log_settings
        The header of the run log: what a resumed run must share.
    """

    profile: Any
    ks: list[int]
    items: list
    contexts: list
    runs: dict[str, list[tuple[int, int]]]
    grid: dict[str, Any]
    seed: int
    max_new_tokens: int
    log_settings: dict[str, Any]


def plan_ablation(lm: LoadedModel, profile: Any, ks: list[int], items: list, lengths: list[int], depths: list[float],
                  haystack: Any, seed: int = 0, max_new_tokens: int = 24, chat_template: bool = True) -> AblationPlan:
    """The prompts and runs of :func:`run_ablation`, checked before any run starts.

    Raises
    ------
    HeadprobeError
        A profile without head scores or made for another model, a k outside ``1 .. heads``.
    """
    check_count("max_new_tokens", max_new_tokens)
    if profile.query_heads is None:
        raise HeadprobeError(f"{profile.kind} profile has no head scores to rank heads by")
    profile.model.check_fits(lm.identity, what=f"{profile.kind} profile")
    scores = np.asarray(profile.query_heads, dtype=np.float64)
    max_ctx = lm.identity.max_context
    pairs = [(it, build_context(lm.tokenizer, haystack, it.needle, L, d, chat_template, max_ctx,
                                question=it.question)) for L in lengths for d in depths for it in items]
    for k in ks:
        if k < 1 or k > scores.size:
            raise HeadprobeError(f"{param('ks', k)}: expected 1 to {scores.size} heads")
    runs: dict[str, list[tuple[int, int]]] = {"baseline": []}
    for k in ks:
        top = top_heads(scores, k)
        runs[f"top-{k}"] = top
        runs[f"random-{k}"] = random_heads(scores.shape, k, seed + k, exclude=top)
    settings = {"model": lm.identity.fingerprint, "profile": profile.fingerprint, "ks": list(ks),
                "items": [i.id for i in items], "lengths": list(lengths), "depths": list(depths), "seed": seed,
                "max_new_tokens": max_new_tokens, "chat_template": chat_template,
                "prompt_format": prompt_format_of(lm.tokenizer, chat_template),
                "haystack": haystack.fingerprint, "headprobe_version": __version__}
    grid = {"lengths": list(lengths), "depths": list(depths), "items": [i.id for i in items]}
    return AblationPlan(profile, list(ks), [p[0] for p in pairs], [p[1] for p in pairs], runs, grid, seed,
                        max_new_tokens, settings)


def run_masked(lm: LoadedModel, plan: AblationPlan, run_ids: list[str], progress: Callable[[int], None] | None = None,
               log_path: str | Path | None = None, resume: bool = False,
               force: bool = False) -> dict[str, dict[str, Any]]:
    """Run the plan's runs ``run_ids``: run id → ``{"accuracy", "trials"}``.

    With ``log_path`` every finished run is appended to a JSONL run log (the trial-log format); ``resume``
    continues it without redoing a finished run, ``force`` starts over.
    """
    log = TrialLog(log_path, plan.log_settings, resume=resume, force=force) if log_path is not None else None
    done: dict[str, dict[str, Any]] = {}
    try:
        for run_id in run_ids:
            heads = plan.runs[run_id]
            if log is not None and run_id in log:
                if progress:
                    progress(len(plan.items))
                done[run_id] = {"accuracy": log.done[run_id]["accuracy"], "trials": log.done[run_id]["trials"]}
                continue
            acc, trials = needle_accuracy(lm, plan.items, plan.contexts, heads, plan.max_new_tokens, progress)
            if log is not None:
                log.append({"trial": run_id, "heads": [f"{l}-{h}" for l, h in heads], "accuracy": acc,
                            "trials": trials})
            done[run_id] = {"accuracy": acc, "trials": trials}
    except BaseException:
        if log is not None:
            log.close(finished=False)
        raise
    if log is not None:
        log.close()
    return done


def ablation_result(lm: LoadedModel, plan: AblationPlan, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ablation result from every run of the plan (:func:`run_masked`)."""
    def heads(run_id: str) -> list[str]:
        return [f"{l}-{h}" for l, h in plan.runs[run_id]]

    rows = []
    for k in plan.ks:
        top, rnd = done[f"top-{k}"], done[f"random-{k}"]
        rows.append({"k": k, "top_heads": heads(f"top-{k}"), "top_accuracy": top["accuracy"],
                     "random_heads": heads(f"random-{k}"), "random_accuracy": rnd["accuracy"],
                     "top_trials": top["trials"], "random_trials": rnd["trials"]})
    profile = plan.profile
    return {"format": "headprobe.ablation", "version": 1, "headprobe_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "model": lm.identity.to_json(),
            "profile_kind": profile.kind, "profile_fingerprint": profile.fingerprint, "grid": plan.grid,
            "seed": plan.seed, "prompt_format": plan.log_settings["prompt_format"],
            "baseline_accuracy": done["baseline"]["accuracy"],
            "baseline_trials": done["baseline"]["trials"], "rows": rows}


def run_ablation(lm: LoadedModel, profile: Any, ks: list[int], items: list, lengths: list[int], depths: list[float],
                 haystack: Any, seed: int = 0, max_new_tokens: int = 24, chat_template: bool = True,
                 progress: Callable[[int], None] | None = None, log_path: str | Path | None = None,
                 resume: bool = False, force: bool = False) -> dict[str, Any]:
    """Needle accuracy with no head masked, the profile's top-k query heads masked, and k random heads.

    The steps: :func:`plan_ablation` (prompts and runs), :func:`run_masked` (the runs), :func:`ablation_result`.
    With ``log_path`` every finished run (baseline, top-k, random-k) is appended to a JSONL run log (the
    trial-log format); ``resume`` continues it without redoing a finished run, ``force`` starts over.

    Returns
    -------
    dict
        ``format: "headprobe.ablation"``, ``version: 1``; ``prompt_format`` (``"chat"`` or ``"plain"``);
        ``baseline_accuracy``; ``rows`` with ``k``,
        ``top_heads``, ``top_accuracy``, ``random_heads``, ``random_accuracy`` and the trials.
    """
    plan = plan_ablation(lm, profile, ks, items, lengths, depths, haystack, seed, max_new_tokens, chat_template)
    done = run_masked(lm, plan, list(plan.runs), progress, log_path, resume, force)
    return ablation_result(lm, plan, done)


def format_ablation(result: dict[str, Any]) -> str:
    lines = [f"no heads masked: accuracy {result['baseline_accuracy']:.3f}",
             f"{'k':>4} {'top-k masked':>13} {'random masked':>14}"]
    for r in result["rows"]:
        lines.append(f"{r['k']:>4} {r['top_accuracy']:>13.3f} {r['random_accuracy']:>14.3f}")
    return "\n".join(lines)
