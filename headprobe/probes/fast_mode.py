"""Fast mode: teacher-forced needle trials, batched, on a haystack prefix computed once per length.

Trials of one length (and seed) share the haystack before the needle: its KV is computed once
(:func:`~headprobe.probes.prompt_cache.prefix_cache`) and copied into each batch. A batch holds trials
of one depth; their suffixes (needle, rest of the haystack, question) run right-padded in one forward,
which yields the rows and logits of the first response step. Each response variant (the bare answer,
the needle's sentence up to the answer, a reasoning needle's distractor) then runs as a short
continuation on the same cache, which is cut back after it, so a variant costs its few tokens instead of
another pass over the prompt. Rows are computed only at the positions that predict response tokens.

A trial passes the published gate only if greedy decoding reproduces one of its variants exactly, so it
would have passed in reference mode too, whose rows at those steps are the same.

The steps: :func:`build_batch` (token tensors of a batch), :func:`prompt_step` (the prompt forward: step 0),
:func:`run_variant` (one variant's continuation and its scores), :func:`batch_records` (log records).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..attention.recorder import RowCallback, RowRecorder, RowRequest
from ..haystack.context import TrialContext, build_context, common_prefix_length, response_tokens
from ..haystack.corpus import Haystack
from ..haystack.needles import Needle
from ..models.cache_argument import with_cache
from .layer_scores import (
    AnswerSpans,
    LayerRows,
    LayerScores,
    StepScorer,
    copy_scores_by_layer,
    reasoning_scores_by_layer,
    zero_totals,
)
from .prompt_cache import HaystackCaches, batch_cache, crop_cache, prefix_cache
from .trial_grid import TrialSpec
from .trial_record import trial_gates, trial_record

if TYPE_CHECKING:
    from ..models.loading import LoadedModel
    from .probe_config import NeedleProbeConfig, NeedleScores

#: Token id that never equals a prompt token (prompt tokens past a prompt's end are -1).
_NO_TOKEN = -2


def restated_answer(needle: Needle) -> str:
    """The needle's sentence up to the end of the answer: what a model that restates the fact says
    before (and including) the answer, e.g. "The best thing to do in Porto is to play dominoes"."""
    start = 0
    for m in re.finditer(r"[.!?][\"')\]]*\s+", needle.needle[:needle.answer_offset]):
        start = m.end()
    return needle.needle[start:needle.answer_offset + len(needle.answer)]


def response_variants(tokenizer, needle: Needle, ctx: TrialContext) -> dict[str, list[int]]:
    """The responses a trial is teacher-forced with, as token ids.

    ``"gold"`` (the answer) always; retrieval needles add ``"restated"`` (:func:`restated_answer`, when it
    differs from the answer), reasoning needles ``"distractor"`` (for the likelihood gate).
    """
    forms = {"gold": response_tokens(tokenizer, ctx, needle.answer)}
    if needle.kind == "retrieval":
        restated = restated_answer(needle)
        if restated != needle.answer:
            forms["restated"] = response_tokens(tokenizer, ctx, restated)
    else:
        forms["distractor"] = response_tokens(tokenizer, ctx, needle.distractor)
    return forms


# ---- a length group: the shared prefix and the batches ------------------------------------------

@torch.no_grad()
def run_fast_length_group(lm: LoadedModel, haystack: Haystack, needles: dict[str, Needle], length: int,
                          specs: list[TrialSpec], config: NeedleProbeConfig,
                          on_trial: Callable[[dict[str, Any]], None], progress: Callable[[int], None] | None,
                          caches: HaystackCaches | None = None) -> None:
    """Run the trials of one length and seed: compute the haystack prefix once, then batch by depth.

    Each finished batch's records go to ``on_trial`` (with the batch's time per trial, the prefix's share
    included) before the next batch starts.

    The prefix's KV comes from one forward over the whole needle-free prompt of this length, whichever
    trials are left to run: a forward over fewer tokens gives the same KV only up to float rounding, so a
    resumed or sharded run (shards, torchrun ranks) would otherwise score its trials a rounding step away
    from a whole run's. With ``caches`` that KV is taken from (or put into) it, so later calls for the same
    length skip the prefix forward.
    """
    tok = lm.tokenizer
    max_context = lm.identity.max_context
    group_start = time.perf_counter()
    base = build_context(tok, haystack, None, length, 0.0, config.chat_template, max_context)
    contexts = [build_context(tok, haystack, needles[s.needle_id], length, s.depth, config.chat_template, max_context)
                for s in specs]
    shared = [min(common_prefix_length(base.input_ids, c.input_ids), c.needle_span[0], c.length - 1)
              for c in contexts]
    if caches is None:
        base_cache = prefix_cache(lm.model, base.input_ids, lm.device)
        base_seconds = (time.perf_counter() - group_start) / len(specs)
    else:
        _, base_cache, seconds = caches.get(lm, haystack, length, config.chat_template)
        base_seconds = seconds / len(specs)
    for members in depth_batches(specs, shared, config.batch_size):
        started = time.perf_counter()
        records = run_fast_batch(lm, base_cache, [specs[i] for i in members], [contexts[i] for i in members],
                                 min(shared[i] for i in members), needles, config)
        per_trial = (time.perf_counter() - started) / len(members) + base_seconds
        for record in records:
            record["seconds"] = round(per_trial, 3)
            on_trial(record)
        if progress:
            progress(len(members))


def depth_batches(specs: list[TrialSpec], shared: list[int], batch_size: int) -> list[list[int]]:
    """Indices of ``specs`` in batches of at most ``batch_size`` trials of one depth.

    Trials of one depth share (almost) the same prefix and suffix lengths, so a batch neither recomputes
    a cached prefix nor pads short suffixes to a long one. Depths with the longest shared prefix
    (``shared``, tokens per trial) come first.
    """
    by_depth: dict[float, list[int]] = {}
    for i, spec in enumerate(specs):
        by_depth.setdefault(spec.depth, []).append(i)
    return [members[start:start + batch_size]
            for members in sorted(by_depth.values(), key=lambda m: -min(shared[i] for i in m))
            for start in range(0, len(members), batch_size)]


# ---- one batch ----------------------------------------------------------------------------------

@dataclass
class FastBatch:
    """A batch of teacher-forced trials sharing ``prefix`` cached tokens, as tensors.

    Attributes
    ----------
    specs, contexts, needles
        Per trial: the grid entry, the rendered prompt and the needle (all of one kind).
    prefix
        Cached prompt tokens every trial shares.
    suffix_ids
        ``[batch, width]`` the rest of each prompt, right-padded.
    attention
        ``[batch, prefix + width]`` 1 for real tokens, 0 for padding.
    prompt_len
        ``[batch]`` prompt lengths.
    spans
        Answer spans and prompt tokens ``[batch, prefix + width]``.
    variants
        Per trial, variant name → forced response tokens (:func:`response_variants`).
    pad_id
        Token id used for padding.
    """

    specs: list[TrialSpec]
    contexts: list[TrialContext]
    needles: list[Needle]
    prefix: int
    suffix_ids: torch.Tensor
    attention: torch.Tensor
    prompt_len: torch.Tensor
    spans: AnswerSpans
    variants: list[dict[str, list[int]]]
    pad_id: int

    @property
    def size(self) -> int:
        return len(self.specs)

    @property
    def total(self) -> int:
        """Cache positions after the prompt forward: ``prefix + width``."""
        return self.attention.shape[1]

    @property
    def variant_names(self) -> list[str]:
        """Every variant some trial has, in first-seen order (``"gold"`` first)."""
        return list(dict.fromkeys(name for forms in self.variants for name in forms))


def build_batch(tokenizer, specs: list[TrialSpec], contexts: list[TrialContext], prefix: int,
                needles: dict[str, Needle]) -> FastBatch:
    """Pad the prompt suffixes after ``prefix`` into one batch and tokenise each trial's variants."""
    trial_needles = [needles[s.needle_id] for s in specs]
    variants = [response_variants(tokenizer, n, c) for n, c in zip(trial_needles, contexts, strict=True)]
    batch = len(specs)
    suffixes = [c.input_ids[prefix:] for c in contexts]
    width = max(len(x) for x in suffixes)
    total = prefix + width
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    suffix_ids = torch.full((batch, width), pad, dtype=torch.long)
    attention = torch.zeros(batch, total, dtype=torch.long)
    attention[:, :prefix] = 1
    prompt_tokens = torch.full((batch, total), -1, dtype=torch.long)
    for b, (x, ctx) in enumerate(zip(suffixes, contexts, strict=True)):
        suffix_ids[b, :len(x)] = torch.tensor(x)
        attention[b, prefix:prefix + len(x)] = 1
        prompt_tokens[b, :ctx.length] = torch.tensor(ctx.input_ids)
    spans = AnswerSpans(torch.tensor([c.answer_span[0] for c in contexts]),
                        torch.tensor([c.answer_span[1] for c in contexts]), prompt_tokens)
    return FastBatch(specs, contexts, trial_needles, prefix, suffix_ids, attention,
                     torch.tensor([c.length for c in contexts]), spans, variants, pad)


@torch.no_grad()
def run_fast_batch(lm: LoadedModel, base_cache, specs: list[TrialSpec], contexts: list[TrialContext],
                   prefix: int, needles: dict[str, Needle],
                   config: NeedleProbeConfig) -> list[dict[str, Any]]:
    """One batch of teacher-forced trials sharing ``prefix`` tokens of ``base_cache``: their log records.

    The prompt forward's attention is split into a pass over the cached prefix and a causal pass over the
    suffix (``config.split_attention``): the prefix is shared by the whole batch and the suffixes are
    right-padded, which is what that split needs.
    """
    model, identity = lm.model, lm.identity
    batch = build_batch(lm.tokenizer, specs, contexts, prefix, needles)
    cache = batch_cache(base_cache, prefix, batch.size)
    layers, heads = identity.num_layers, identity.num_query_heads
    with RowRecorder(model) as rec:
        step0 = prompt_step(model, rec, batch, cache, config.split_attention, layers, heads, lm.device)
        results = {name: run_variant(model, rec, batch, cache, step0, name, config.scores, layers, heads,
                                     lm.device)
                   for name in batch.variant_names}
    return batch_records(lm.tokenizer, batch, results)


@dataclass
class PromptStep:
    """The first response step of every trial of a batch, from the prompt forward.

    Attributes
    ----------
    rows
        Per layer, rows ``[batch, query_heads, 1, keys]`` at each prompt's last position (on the model's
        device).
    logp
        ``[batch, vocab]`` float32 log-probabilities of the first response token.
    weight_scores
        ``[batch, layers, query_heads]`` float64 attention-weight score (HeadKV-ER / R2) of the rows; it does
        not depend on the token, so every variant shares it.
    """

    rows: LayerRows
    logp: torch.Tensor
    weight_scores: torch.Tensor


def prompt_step(model, recorder: RowRecorder, batch: FastBatch, cache, split_attention: bool, layers: int,
                heads: int, device: torch.device) -> PromptStep:
    """Run the prompt suffixes on ``cache`` (which then holds ``batch.total`` positions); keep step 0."""
    prefix, total, size = batch.prefix, batch.total, batch.size
    first = (batch.prompt_len - 1)[:, None]                                   # [batch, 1] last prompt positions
    rows: LayerRows = {}
    keep_local = sorted({int(p) - prefix for p in first.flatten().tolist()})
    recorder.request = RowRequest(first.to(device), prefix, _rows_on_device(rows),
                                  key_mask=batch.attention.bool().to(device), prefix_visible=split_attention)
    out = model(input_ids=batch.suffix_ids.to(device), attention_mask=batch.attention.to(device),
                use_cache=True, **with_cache(model, cache),
                position_ids=torch.arange(prefix, total, device=device)[None].expand(size, -1),
                logits_to_keep=torch.tensor(keep_local, device=device))
    index_of = {p: i for i, p in enumerate(keep_local)}
    logp = torch.log_softmax(out.logits.float(), dim=-1)
    logp = torch.stack([logp[b, index_of[int(first[b, 0]) - prefix]] for b in range(size)]).cpu()
    del out
    weight = torch.zeros(size, layers, heads, dtype=torch.float64)
    spans = _spans_on(batch.spans, device)
    _to_host(reasoning_scores_by_layer(rows, spans, torch.ones(size, 1, dtype=torch.bool))).write_to(weight)
    return PromptStep(rows, logp, weight)


# Rows are scored where the model ran; only the per-head scores ([batch, layers, heads]) reach the host.

def _rows_on_device(store: LayerRows) -> RowCallback:
    """A row-recorder callback that keeps each layer's rows and key positions where they were computed."""
    def keep(layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        store[layer] = (rows, key_positions)
    return keep


def _spans_on(spans: AnswerSpans, device: torch.device) -> AnswerSpans:
    return AnswerSpans(spans.start.to(device), spans.end.to(device), spans.prompt_tokens.to(device))


def _to_host(scores: LayerScores) -> LayerScores:
    return LayerScores(scores.layers, scores.values.cpu())


@dataclass
class VariantResult:
    """One response variant teacher-forced on every trial of a batch.

    Attributes
    ----------
    forced
        Per trial, the forced tokens (empty where the trial has no such variant).
    greedy
        Per trial, the greedy token at each forced step.
    likelihood
        Per trial, ``log p`` of the forced tokens (sum).
    totals
        Score name → ``[batch, layers, query_heads]`` float64 sums over the forced steps.
    """

    forced: list[list[int]]
    greedy: list[list[int]]
    likelihood: list[float]
    totals: dict[str, torch.Tensor]

    def reproduced(self, trial: int) -> bool:
        """Whether greedy decoding gives this variant exactly for ``trial``."""
        return self.greedy[trial] == self.forced[trial]


def run_variant(model, recorder: RowRecorder, batch: FastBatch, cache, step0: PromptStep, name: str,
                scores: NeedleScores, layers: int, heads: int, device: torch.device) -> VariantResult:
    """Score variant ``name`` (``scores``: which scores, under which names): step 0 from the prompt
    forward, the rest from a continuation on ``cache`` (cut back to ``batch.total`` positions after)."""
    forced = [forms.get(name, []) for forms in batch.variants]
    result = _variant_step0(batch, step0, forced, scores, layers, heads)
    steps = max(len(f) for f in forced) - 1
    if steps > 0:
        _continue_variant(model, recorder, batch, cache, result, scores, steps, device)
    return result


def _variant_step0(batch: FastBatch, step0: PromptStep, forced: list[list[int]], scores: NeedleScores, layers: int,
                   heads: int) -> VariantResult:
    """A variant's result after its first token: step 0's scores, greedy token and log-probability."""
    has = torch.tensor([len(f) > 0 for f in forced])
    totals = zero_totals(scores, batch.size, layers, heads)
    totals[scores.weight] += step0.weight_scores * has[:, None, None]
    if scores.copy is not None:
        tokens0 = torch.tensor([[f[0] if f else _NO_TOKEN] for f in forced])
        device = next(iter(step0.rows.values()))[0].device if step0.rows else torch.device("cpu")
        copied = copy_scores_by_layer(step0.rows, _spans_on(batch.spans, device), tokens0.to(device),
                                      has[:, None].to(device))
        _to_host(copied).add_to(totals[scores.copy])
    greedy = [[int(step0.logp[b].argmax())] if f else [] for b, f in enumerate(forced)]
    likelihood = [float(step0.logp[b, f[0]]) if f else 0.0 for b, f in enumerate(forced)]
    return VariantResult(forced, greedy, likelihood, totals)


def _continue_variant(model, recorder: RowRecorder, batch: FastBatch, cache, result: VariantResult,
                      scores: NeedleScores, steps: int, device: torch.device) -> None:
    """Teacher-force tokens 1.. of each trial's variant (right-padded to ``steps``) after the prompt;
    add their scores, greedy tokens and log-probabilities to ``result``."""
    size, total = batch.size, batch.total
    ids = torch.full((size, steps), batch.pad_id, dtype=torch.long)           # inputs: forced tokens 0..n-1
    mask = torch.zeros(size, steps, dtype=torch.long)
    step_tokens = torch.full((size, steps), _NO_TOKEN, dtype=torch.long)      # predicted: forced tokens 1..n
    for b, f in enumerate(result.forced):
        n = len(f) - 1
        if n > 0:
            ids[b, :n] = torch.tensor(f[:-1])
            mask[b, :n] = 1
            step_tokens[b, :n] = torch.tensor(f[1:])
    positions = batch.prompt_len[:, None] + torch.arange(steps)[None]        # absolute
    key_positions = torch.cat([torch.arange(total)[None].expand(size, -1), positions], dim=1)
    full_mask = torch.cat([batch.attention, mask], dim=1)
    scorer = StepScorer(result.totals, scores, _spans_on(batch.spans, device), step_tokens.to(device),
                        mask.bool().to(device))
    recorder.request = RowRequest(positions.to(device), total, scorer, key_mask=full_mask.bool().to(device),
                                  query_index=torch.arange(steps)[None].expand(size, -1).to(device),
                                  key_positions=key_positions.to(device))
    out = model(input_ids=ids.to(device), attention_mask=full_mask.to(device), **with_cache(model, cache),
                use_cache=True, position_ids=positions.to(device), logits_to_keep=steps)
    logp = torch.log_softmax(out.logits.float(), dim=-1).cpu()
    del out
    crop_cache(cache, total)
    for b, f in enumerate(result.forced):
        for t in range(len(f) - 1):
            result.greedy[b].append(int(logp[b, t].argmax()))
            result.likelihood[b] += float(logp[b, t, f[t + 1]])


def batch_records(tokenizer, batch: FastBatch, results: dict[str, VariantResult],
                  mode: str = "fast") -> list[dict[str, Any]]:
    """Log records of a batch: each trial's response is the first variant greedy decoding reproduces
    (the answer, else the restated sentence; the answer when neither is), its scores that variant's.
    ``mode`` is what the records name as their mode (reuse mode builds its batches the same way)."""
    records = []
    for i, (spec, ctx, needle) in enumerate(zip(batch.specs, batch.contexts, batch.needles, strict=True)):
        chosen = "gold"
        exact = results["gold"].reproduced(i)
        if not exact and "restated" in batch.variants[i] and results["restated"].reproduced(i):
            chosen, exact = "restated", True
        response = tokenizer.decode(results[chosen].greedy[i], skip_special_tokens=True)
        margin = None
        if "distractor" in batch.variants[i]:       # reasoning needles: the likelihood gate's margin
            margin = results["gold"].likelihood[i] - results["distractor"].likelihood[i]
        gates, passed = trial_gates(needle, response, margin, exact)
        scores = {name: total[i] for name, total in results[chosen].totals.items()}
        records.append(trial_record(spec, ctx, response, scores, gates, passed, 0.0, mode))
    return records
