"""Needle trials: rows of the answer steps, head scores, gates. Fast and reference modes.

``reference`` follows the published procedure: one prefill over the whole prompt, then greedy decoding
step by step, taking the attention row of every step. ``fast`` teacher-forces the gold answer: trials
of one length share the haystack prefix before the needle, whose KV is computed once and reused; the
suffixes (needle, rest of the haystack, question, gold answer) of a batch of trials run in one forward;
rows are computed only for the positions that predict answer tokens. A fast trial passes its gate
only if greedy decoding would have produced the gold answer, so it would have counted in reference
mode too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import RowRecorder, RowRequest
from ..haystack.context import TrialContext, build_context, common_prefix_length, response_tokens
from ..haystack.corpus import Haystack
from ..haystack.needles import Needle
from ..models.identity import text_config
from ..models.loading import generation_eos_ids
from .gates import qa_f1, rouge1_recall
from .head_scores import copy_scores, reasoning_scores
from .trial_grid import TrialSpec


@dataclass
class NeedleProbeConfig:
    """Settings of a needle probe run.

    Attributes
    ----------
    mode
        ``"fast"`` or ``"reference"``.
    chat_template
        Apply the model's chat template.
    batch_size
        Trials per forward in fast mode.
    max_new_tokens
        Reference mode, retrieval needles: decoding steps (stops earlier at end of sequence).
        Reasoning needles decode ``len(answer)`` tokens, as published.
    gate
        Reasoning needles: ``"published"`` (QA-F1 of the decoded answer; the decoded steps are scored) or
        ``"likelihood"`` (correct candidate more likely than the distractor; the steps that produce the
        correct candidate after the prompt are scored, in both modes).
    split_attention
        Fast mode: run the prompt forward's attention as an unmasked pass over the cached prefix plus a
        causal pass over the rest, merged by log-sum-exp (:mod:`headprobe.attention.prefix_split`; CPU,
        global-attention layers). ``False`` runs one masked SDPA call; the results agree to float rounding.
    """

    mode: str = "fast"
    chat_template: bool = True
    batch_size: int = 4
    max_new_tokens: int = 24
    gate: str = "published"
    split_attention: bool = True


def _score_names(kind: str) -> tuple[str, ...]:
    return ("retrieval", "enhanced_retrieval") if kind == "retrieval" else ("retrieval_reasoning",)


def _answer_tokens(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _eos_ids(loaded) -> set[int]:
    """Where a reference-mode answer ends: ``generate``'s end-of-sequence ids and the tokenizer's."""
    ids = generation_eos_ids(loaded.model)
    if loaded.tokenizer.eos_token_id is not None:
        ids.add(loaded.tokenizer.eos_token_id)
    return ids


def _layer_count(model) -> int:
    return text_config(model.config).num_hidden_layers


def _record(spec: TrialSpec, needle: Needle, ctx: TrialContext, response: str, scores: dict[str, torch.Tensor],
            gates: dict[str, Any], passed: bool, seconds: float, mode: str) -> dict[str, Any]:
    return {
        "trial": spec.id, "needle": spec.needle_id, "length": spec.length, "depth": spec.depth, "seed": spec.seed,
        "mode": mode, "prompt_tokens": ctx.length, "answer_span": list(ctx.answer_span),
        "actual_depth": round(ctx.actual_depth, 4), "response": response, "gates": gates, "passed": passed,
        "scores": {k: [[round(float(x), 6) for x in row] for row in v.tolist()] for k, v in scores.items()},
        "seconds": round(seconds, 3),
    }


def _gates(kind: str, needle: Needle, response: str, margin: float | None, exact: bool | None) -> tuple[dict, bool]:
    """Gate values and whether the trial counts (published gate)."""
    gates: dict[str, Any] = {"rouge1_recall": round(rouge1_recall(response, needle.answer), 4),
                             "qa_f1": round(qa_f1(response, needle.answer), 4)}
    if exact is not None:
        gates["greedy_is_gold"] = exact
    if margin is not None:
        gates["likelihood_margin"] = round(margin, 4)
        gates["likelihood"] = margin > 0
    published = gates["qa_f1"] > 0.5 if kind == "reasoning" else gates["rouge1_recall"] > 0.5
    if exact is not None:  # fast mode: only when greedy decoding would give the gold answer
        published = published and exact
    gates["published"] = published
    return gates, published


def run_needle_trials(
    loaded,
    haystacks: dict[int, Haystack],
    needles: dict[str, Needle],
    trials: list[TrialSpec],
    config: NeedleProbeConfig,
    on_trial: Callable[[dict[str, Any]], None],
    progress: Callable[[int], None] | None = None,
) -> None:
    """Run ``trials`` and hand each finished trial's record to ``on_trial`` (which appends it to the log).

    Parameters
    ----------
    loaded
        :class:`headprobe.LoadedModel`.
    haystacks
        Haystack per seed.
    needles
        Needles by id; all of one kind.
    trials
        Trials still to run.
    """
    if config.mode == "reference":
        for spec in trials:
            on_trial(_reference_trial(loaded, haystacks[spec.seed], needles[spec.needle_id], spec, config))
            if progress:
                progress(1)
        return
    by_length: dict[tuple[int, int], list[TrialSpec]] = {}
    for spec in trials:
        by_length.setdefault((spec.length, spec.seed), []).append(spec)
    for (length, seed), group in sorted(by_length.items()):
        _fast_length_group(loaded, haystacks[seed], needles, length, group, config, on_trial, progress)


# ---- reference mode -----------------------------------------------------------------------------

@torch.no_grad()
def _reference_trial(loaded, haystack: Haystack, needle: Needle, spec: TrialSpec,
                     config: NeedleProbeConfig) -> dict[str, Any]:
    from transformers import DynamicCache

    start = time.perf_counter()
    model, tok = loaded.model, loaded.tokenizer
    device = loaded.device
    ctx = build_context(tok, haystack, needle, spec.length, spec.depth, config.chat_template,
                        loaded.identity.max_context)
    ids = torch.tensor([ctx.input_ids], device=device)
    prompt_len = ids.shape[1]
    gold = response_tokens(tok, ctx, needle.answer)
    steps = len(gold) if needle.kind == "reasoning" else config.max_new_tokens
    eos = _eos_ids(loaded)
    layers = _layer_count(model)
    heads = loaded.identity.num_query_heads
    names = _score_names(needle.kind)
    totals = {n: torch.zeros(layers, heads, dtype=torch.float64) for n in names}
    span_start = torch.tensor([ctx.answer_span[0]])
    span_end = torch.tensor([ctx.answer_span[1]])
    prompt_tokens = ids.cpu()
    pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        pending[layer] = (rows.cpu(), key_positions.cpu())

    cache = DynamicCache()
    generated: list[int] = []
    with RowRecorder(model) as rec:
        inputs = ids
        block_start = 0
        for step in range(steps):
            position = prompt_len - 1 + step
            rec.request = RowRequest(torch.tensor([[position]]), block_start, keep)
            out = model(input_ids=inputs, past_key_values=cache, use_cache=True, logits_to_keep=1,
                        position_ids=torch.arange(block_start, block_start + inputs.shape[1], device=device)[None])
            token = int(out.logits[0, -1].argmax())
            if token in eos:
                break
            step_tokens = torch.tensor([[token]])
            mask = torch.ones(1, 1, dtype=torch.bool)
            for layer, (rows, kp) in pending.items():
                if "retrieval" in names:
                    totals["retrieval"][layer] += copy_scores(rows, kp, span_start, span_end, step_tokens, mask,
                                                              prompt_tokens)[0]
                name = "enhanced_retrieval" if needle.kind == "retrieval" else "retrieval_reasoning"
                totals[name][layer] += reasoning_scores(rows, kp, span_start, span_end, mask)[0]
            pending.clear()
            generated.append(token)
            block_start = position + 1
            inputs = torch.tensor([[token]], device=device)
    response = tok.decode(generated, skip_special_tokens=True)
    margin = None
    if needle.kind == "reasoning":
        gold_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        margin = _candidate_margin(model, cache, ids, needle, tok, device, ctx, gold_rows)
        if config.gate == "likelihood":
            mask = torch.ones(1, len(gold), dtype=torch.bool)
            for layer, (rows, kp) in gold_rows.items():
                totals["retrieval_reasoning"][layer] = reasoning_scores(rows, kp, span_start, span_end, mask)[0]
    gates, passed = _gates(needle.kind, needle, response, margin, None)
    return _record(spec, needle, ctx, response, totals, gates, passed, time.perf_counter() - start, "reference")


@torch.no_grad()
def _candidate_margin(model, cache, ids: torch.Tensor, needle: Needle, tok, device, ctx: TrialContext,
                      gold_rows: dict | None = None) -> float:
    """``log p(correct | prompt) − log p(distractor | prompt)`` (sum over each candidate's tokens).

    Reuses the prompt's cache: it is cut back to the prompt minus its last token for each candidate.
    ``gold_rows`` (if given) receives each layer's attention rows of the steps producing the correct one.
    """
    prompt_len = ids.shape[1]
    scores = []
    for cand in (needle.candidates[1], needle.candidates[0]):
        c = response_tokens(tok, ctx, cand)
        _crop_to(cache, prompt_len - 1)
        inputs = torch.tensor([[int(ids[0, -1])] + c[:-1]], device=device)
        positions = torch.arange(prompt_len - 1, prompt_len - 1 + len(c), device=device)[None]
        with RowRecorder(model) as rec:
            if gold_rows is not None and cand == needle.candidates[1]:
                rec.request = RowRequest(positions, prompt_len - 1,
                                         lambda layer, rows, kp: gold_rows.__setitem__(layer, (rows.cpu(), kp.cpu())))
            out = model(input_ids=inputs, past_key_values=cache, use_cache=True, position_ids=positions)
        logp = torch.log_softmax(out.logits[0].float(), dim=-1)
        scores.append(float(logp[torch.arange(len(c)), torch.tensor(c, device=device)].sum()))
    return scores[0] - scores[1]


def _crop_to(cache, length: int) -> None:
    """Cut a DynamicCache back to its first ``length`` positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def restated_answer(needle: Needle) -> str:
    """The needle's sentence up to the end of the answer: what a model that restates the fact says
    before (and including) the answer, e.g. "The best thing to do in Porto is to play dominoes"."""
    import re

    start = 0
    for m in re.finditer(r"[.!?][\"')\]]*\s+", needle.needle[:needle.answer_offset]):
        start = m.end()
    return needle.needle[start:needle.answer_offset + len(needle.answer)]


# ---- fast mode ----------------------------------------------------------------------------------

@torch.no_grad()
def _fast_length_group(loaded, haystack: Haystack, needles: dict[str, Needle], length: int,
                       specs: list[TrialSpec], config: NeedleProbeConfig,
                       on_trial: Callable[[dict[str, Any]], None], progress) -> None:
    from transformers import DynamicCache

    model, tok = loaded.model, loaded.tokenizer
    device = loaded.device
    group_start = time.perf_counter()
    base = build_context(tok, haystack, None, length, 0.0, config.chat_template, loaded.identity.max_context)
    contexts = [build_context(tok, haystack, needles[s.needle_id], length, s.depth, config.chat_template,
                              loaded.identity.max_context) for s in specs]
    shared = [min(common_prefix_length(base.input_ids, c.input_ids), c.needle_span[0], c.length - 1)
              for c in contexts]
    # KV of the haystack prefix, computed once for the whole length group (all layers kept in full,
    # sliding-window layers included, so any prefix length can be reused).
    longest = max(shared)
    base_cache = DynamicCache()
    if longest > 0:
        model(input_ids=torch.tensor([base.input_ids[:longest]], device=device), past_key_values=base_cache,
              use_cache=True, logits_to_keep=1)
    base_seconds = (time.perf_counter() - group_start) / len(specs)
    # Batch only trials of one depth: they share (almost) the same prefix and suffix lengths, so a batch
    # neither recomputes a cached prefix nor pads short suffixes to a long one.
    by_depth: dict[float, list[int]] = {}
    for i, spec in enumerate(specs):
        by_depth.setdefault(spec.depth, []).append(i)
    chunks = []
    for members in sorted(by_depth.values(), key=lambda m: -min(shared[i] for i in m)):
        for start in range(0, len(members), config.batch_size):
            chunks.append(members[start:start + config.batch_size])
    for chunk in chunks:
        started = time.perf_counter()
        records = _fast_batch(loaded, base_cache, [specs[i] for i in chunk], [contexts[i] for i in chunk],
                              min(shared[i] for i in chunk), needles, config)
        per_trial = (time.perf_counter() - started) / len(chunk) + base_seconds
        for record in records:
            record["seconds"] = round(per_trial, 3)
            on_trial(record)
        if progress:
            progress(len(chunk))


def _fast_batch(loaded, base_cache, specs: list[TrialSpec], contexts: list[TrialContext], prefix: int,
                needles: dict[str, Needle], config: NeedleProbeConfig) -> list[dict[str, Any]]:
    """One batch of teacher-forced trials sharing ``prefix`` cached tokens.

    The prompts run in one forward (right-padded); the first response step's rows and logits come from
    it. Each response variant (the bare answer, the restated sentence, a reasoning needle's distractor)
    then runs as a short continuation on the same cache, which is cut back after each variant, so a
    variant costs its few tokens instead of another pass over the prompt. The prompt forward's
    attention is split into a pass over the cached prefix and a causal pass over the suffix
    (``config.split_attention``): the prefix is shared by the whole batch and the suffixes are
    right-padded, which is what that split needs.
    """
    from transformers import DynamicCache

    model, tok = loaded.model, loaded.tokenizer
    device = loaded.device
    batch = len(specs)
    kind = needles[specs[0].needle_id].kind
    names = _score_names(kind)
    layers = _layer_count(model)
    heads = loaded.identity.num_query_heads

    variants: list[dict[str, list[int]]] = []
    for spec, ctx in zip(specs, contexts):
        needle = needles[spec.needle_id]
        forms = {"gold": response_tokens(tok, ctx, needle.answer)}
        if needle.kind == "retrieval":
            restated = restated_answer(needle)
            if restated != needle.answer:
                forms["restated"] = response_tokens(tok, ctx, restated)
        else:
            forms["distractor"] = response_tokens(tok, ctx, needle.distractor)
        variants.append(forms)
    variant_names = list(dict.fromkeys(name for forms in variants for name in forms))

    prompt_len = torch.tensor([c.length for c in contexts])
    suffixes = [c.input_ids[prefix:] for c in contexts]
    width = max(len(x) for x in suffixes)
    total = prefix + width
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    input_ids = torch.full((batch, width), pad, dtype=torch.long)
    attention = torch.zeros(batch, total, dtype=torch.long)
    attention[:, :prefix] = 1
    prompt_tokens = torch.full((batch, total), -1, dtype=torch.long)
    for b, (x, ctx) in enumerate(zip(suffixes, contexts)):
        input_ids[b, :len(x)] = torch.tensor(x)
        attention[b, prefix:prefix + len(x)] = 1
        prompt_tokens[b, :ctx.length] = torch.tensor(ctx.input_ids)
    span_start = torch.tensor([c.answer_span[0] for c in contexts])
    span_end = torch.tensor([c.answer_span[1] for c in contexts])

    cache = DynamicCache()
    for layer_idx, layer in enumerate(base_cache.layers):
        if prefix > 0:
            cache.update(layer.keys[:, :, :prefix].expand(batch, -1, -1, -1).contiguous(),
                         layer.values[:, :, :prefix].expand(batch, -1, -1, -1).contiguous(), layer_idx)

    # ---- the prompts: rows and logits of the first response step (position P - 1) -------------------
    first = (prompt_len - 1)[:, None]                                   # [b, 1]
    step0: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(layer: int, layer_rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        step0[layer] = (layer_rows.cpu(), key_positions.cpu())

    keep_local = sorted({int(p) - prefix for p in first.flatten().tolist()})
    with RowRecorder(model) as rec:
        rec.request = RowRequest(first.to(device), prefix, keep, key_mask=attention.bool().to(device),
                                 prefix_visible=config.split_attention)
        out = model(input_ids=input_ids.to(device), attention_mask=attention.to(device), past_key_values=cache,
                    use_cache=True, position_ids=torch.arange(prefix, total, device=device)[None].expand(batch, -1),
                    logits_to_keep=torch.tensor(keep_local, device=device))
        index_of = {p: i for i, p in enumerate(keep_local)}
        logp0 = torch.log_softmax(out.logits.float(), dim=-1)
        logp0 = torch.stack([logp0[b, index_of[int(first[b, 0]) - prefix]] for b in range(batch)]).cpu()
        del out

        step0_r2 = torch.zeros(batch, layers, heads, dtype=torch.float64)
        all_rows = torch.ones(batch, 1, dtype=torch.bool)
        for layer, (layer_rows, kp) in step0.items():
            step0_r2[:, layer] = reasoning_scores(layer_rows, kp, span_start, span_end, all_rows)

        results: dict[str, dict[str, Any]] = {}
        for name in variant_names:
            forced = [forms.get(name, []) for forms in variants]
            has = torch.tensor([len(f) > 0 for f in forced])
            totals = {n: torch.zeros(batch, layers, heads, dtype=torch.float64) for n in names}
            r2_name = "enhanced_retrieval" if kind == "retrieval" else "retrieval_reasoning"
            totals[r2_name] += step0_r2 * has[:, None, None]
            if "retrieval" in names:
                tokens0 = torch.tensor([[f[0] if f else -2] for f in forced])
                for layer, (layer_rows, kp) in step0.items():
                    totals["retrieval"][:, layer] += copy_scores(layer_rows, kp, span_start, span_end, tokens0,
                                                                 has[:, None], prompt_tokens)
            greedy = [[int(logp0[b].argmax())] if forced[b] else [] for b in range(batch)]
            likelihood = [float(logp0[b, forced[b][0]]) if forced[b] else 0.0 for b in range(batch)]
            steps = max(len(f) for f in forced) - 1
            if steps > 0:
                cont_ids = torch.full((batch, steps), pad, dtype=torch.long)
                cont_mask = torch.zeros(batch, steps, dtype=torch.long)
                step_tokens = torch.full((batch, steps), -2, dtype=torch.long)
                for b, f in enumerate(forced):
                    n = len(f) - 1
                    if n > 0:
                        cont_ids[b, :n] = torch.tensor(f[:-1])
                        cont_mask[b, :n] = 1
                        step_tokens[b, :n] = torch.tensor(f[1:])
                step_mask = cont_mask.bool()
                positions = prompt_len[:, None] + torch.arange(steps)[None]          # absolute
                key_positions = torch.cat([torch.arange(total)[None].expand(batch, -1), positions], dim=1)
                full_mask = torch.cat([attention, cont_mask], dim=1)

                def score(layer: int, layer_rows: torch.Tensor, kp: torch.Tensor) -> None:
                    kp = kp.cpu()
                    layer_rows = layer_rows.cpu()
                    if "retrieval" in names:
                        totals["retrieval"][:, layer] += copy_scores(layer_rows, kp, span_start, span_end,
                                                                     step_tokens, step_mask, prompt_tokens)
                    totals[r2_name][:, layer] += reasoning_scores(layer_rows, kp, span_start, span_end, step_mask)

                rec.request = RowRequest(positions.to(device), total, score, key_mask=full_mask.bool().to(device),
                                         query_index=torch.arange(steps)[None].expand(batch, -1).to(device),
                                         key_positions=key_positions.to(device))
                out = model(input_ids=cont_ids.to(device), attention_mask=full_mask.to(device),
                            past_key_values=cache, use_cache=True, position_ids=positions.to(device),
                            logits_to_keep=steps)
                logp = torch.log_softmax(out.logits.float(), dim=-1).cpu()
                del out
                _crop_to(cache, total)
                for b, f in enumerate(forced):
                    for t in range(len(f) - 1):
                        greedy[b].append(int(logp[b, t].argmax()))
                        likelihood[b] += float(logp[b, t, f[t + 1]])
            results[name] = {"forced": forced, "greedy": greedy, "likelihood": likelihood, "totals": totals}

    records = []
    for i, (spec, ctx) in enumerate(zip(specs, contexts)):
        needle = needles[spec.needle_id]
        chosen = "gold"
        exact = results["gold"]["greedy"][i] == results["gold"]["forced"][i]
        if not exact and "restated" in variants[i] and \
                results["restated"]["greedy"][i] == results["restated"]["forced"][i]:
            chosen, exact = "restated", True
        response = tok.decode(results[chosen]["greedy"][i], skip_special_tokens=True)
        margin = None
        if needle.kind == "reasoning":
            margin = results["gold"]["likelihood"][i] - results["distractor"]["likelihood"][i]
        gates, passed = _gates(needle.kind, needle, response, margin, exact)
        scores = {n: results[chosen]["totals"][n][i] for n in names}
        records.append(_record(spec, needle, ctx, response, scores, gates, passed, 0.0, "fast"))
    return records
