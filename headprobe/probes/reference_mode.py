"""Reference mode: the published procedure, one trial at a time.

One prefill over the whole prompt, then greedy decoding step by step; the attention rows of every
step (the query position that predicts the step's token) are scored once the token is known. Retrieval
needles decode up to ``max_new_tokens`` steps, reasoning needles ``len(answer)`` steps; decoding stops
at an end-of-sequence token, whose step is not scored. Reasoning needles also get the likelihood
margin of the correct candidate over the distractor, computed on the trial's own cache.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from ..attention.recorder import RowRecorder, RowRequest
from ..haystack.context import TrialContext, build_context, response_tokens
from ..haystack.corpus import Haystack
from ..haystack.needles import Needle
from ..models.cache_argument import with_cache
from ..models.loading import LoadedModel, generation_eos_ids
from .layer_scores import (
    AnswerSpans,
    LayerRows,
    collect_rows,
    copy_scores_by_layer,
    reasoning_scores_by_layer,
    zero_totals,
)
from .prompt_cache import crop_cache
from .trial_grid import TrialSpec
from .trial_record import trial_gates, trial_record

if TYPE_CHECKING:
    from .probe_config import NeedleProbeConfig, NeedleScores


def eos_ids(lm: LoadedModel) -> set[int]:
    """Where a reference-mode answer ends: ``generate``'s end-of-sequence ids and the tokenizer's."""
    ids = generation_eos_ids(lm.model)
    if lm.tokenizer.eos_token_id is not None:
        ids.add(lm.tokenizer.eos_token_id)
    return ids


@torch.no_grad()
def run_reference_trial(lm: LoadedModel, haystack: Haystack, needle: Needle, spec: TrialSpec,
                        config: NeedleProbeConfig) -> dict[str, Any]:
    """Run one trial by greedy decoding; return its log record."""
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import DynamicCache

    start = time.perf_counter()
    tok, identity = lm.tokenizer, lm.identity
    ctx = build_context(tok, haystack, needle, spec.length, spec.depth, config.chat_template, identity.max_context)
    prompt = torch.tensor([ctx.input_ids])                                   # [1, prompt_len]
    spans = AnswerSpans(torch.tensor([ctx.answer_span[0]]), torch.tensor([ctx.answer_span[1]]), prompt)
    gold = response_tokens(tok, ctx, needle.answer)
    steps = len(gold) if needle.kind == "reasoning" else config.max_new_tokens
    totals = zero_totals(config.scores, 1, identity.num_layers, identity.num_query_heads)
    cache = DynamicCache()
    generated = decode_scored_steps(lm, prompt, steps, cache, spans, config.scores, totals)
    response = tok.decode(generated, skip_special_tokens=True)
    margin = None
    if needle.kind == "reasoning":
        gold_rows: LayerRows = {}
        margin = candidate_margin(lm, cache, prompt, needle, ctx, gold_rows)
        if config.gate == "likelihood":
            mask = torch.ones(1, len(gold), dtype=torch.bool)
            reasoning_scores_by_layer(gold_rows, spans, mask).write_to(totals[config.scores.weight])
    gates, passed = trial_gates(needle, response, margin, None)
    scores = {name: total[0] for name, total in totals.items()}
    return trial_record(spec, ctx, response, scores, gates, passed, time.perf_counter() - start, "reference")


def decode_scored_steps(lm: LoadedModel, prompt: torch.Tensor, steps: int, cache, spans: AnswerSpans,
                        scores: NeedleScores, totals: dict[str, torch.Tensor]) -> list[int]:
    """Greedy decoding that adds each step's head scores to ``totals``.

    Parameters
    ----------
    prompt
        ``[1, prompt_len]`` prompt token ids.
    steps
        Most tokens to decode; an end-of-sequence token ends decoding and its step is not scored.
    cache
        An empty :class:`~transformers.DynamicCache`; it holds the prompt and the decoded tokens after.
    spans
        The trial's answer span and prompt tokens.
    scores
        Which scores are kept, under which names.
    totals
        Score name → ``[1, layers, query_heads]`` float64, added to in place.

    Returns
    -------
    list[int]
        The decoded tokens (without the end-of-sequence token).
    """
    model, device = lm.model, lm.device
    eos = eos_ids(lm)
    step_rows: LayerRows = {}
    generated: list[int] = []
    inputs = prompt.to(device)
    block_start = 0
    with RowRecorder(model) as rec:
        for step in range(steps):
            position = prompt.shape[1] - 1 + step
            rec.request = RowRequest(torch.tensor([[position]]), block_start, collect_rows(step_rows))
            out = model(input_ids=inputs, **with_cache(model, cache), use_cache=True, logits_to_keep=1,
                        position_ids=torch.arange(block_start, block_start + inputs.shape[1], device=device)[None])
            token = int(out.logits[0, -1].argmax())
            if token in eos:
                break
            _add_step_scores(step_rows, spans, scores, token, totals)
            step_rows.clear()
            generated.append(token)
            block_start = position + 1
            inputs = torch.tensor([[token]], device=device)
    return generated


def _add_step_scores(step_rows: LayerRows, spans: AnswerSpans, scores: NeedleScores, token: int,
                     totals: dict[str, torch.Tensor]) -> None:
    """Add one decoding step's scores, all layers at once (``step_rows``: ``[1, heads, 1, keys]`` per layer)."""
    mask = torch.ones(1, 1, dtype=torch.bool)
    if scores.copy is not None:
        copy_scores_by_layer(step_rows, spans, torch.tensor([[token]]), mask).add_to(totals[scores.copy])
    reasoning_scores_by_layer(step_rows, spans, mask).add_to(totals[scores.weight])


@torch.no_grad()
def candidate_margin(lm: LoadedModel, cache, prompt: torch.Tensor, needle: Needle, ctx: TrialContext,
                     gold_rows: LayerRows | None = None) -> float:
    """``log p(correct | prompt) − log p(distractor | prompt)`` (sum over each candidate's tokens).

    Reuses the prompt's cache: it is cut back to the prompt minus its last token for each candidate.

    Parameters
    ----------
    prompt
        ``[1, prompt_len]`` prompt token ids.
    gold_rows
        If given, receives each layer's attention rows ``[1, heads, len(correct), keys]`` of the steps
        that produce the correct candidate.
    """
    model, tok, device = lm.model, lm.tokenizer, lm.device
    prompt_len = prompt.shape[1]
    scores = []
    for cand in (needle.candidates[1], needle.candidates[0]):
        c = response_tokens(tok, ctx, cand)
        crop_cache(cache, prompt_len - 1)
        inputs = torch.tensor([[int(prompt[0, -1])] + c[:-1]], device=device)
        positions = torch.arange(prompt_len - 1, prompt_len - 1 + len(c), device=device)[None]
        with RowRecorder(model) as rec:
            if gold_rows is not None and cand == needle.candidates[1]:
                rec.request = RowRequest(positions, prompt_len - 1, collect_rows(gold_rows))
            out = model(input_ids=inputs, **with_cache(model, cache), use_cache=True, position_ids=positions)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        scores.append(float(logp[torch.arange(len(c)), torch.tensor(c, device=device)].sum()))
    return scores[0] - scores[1]
