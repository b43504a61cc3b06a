"""Reuse mode: approximate needle trials on one haystack forward per length and seed.

The haystack prompt (no needle) of a length runs once; its KV serves every trial of that length. Each
trial then runs :func:`~headprobe.probes.selective_prefill.selective_trial_forward`: the prefix before
the needle as cached, the needle and the question computed, and of the haystack after the needle only
the ``recompute_share`` of tokens whose keys and values the needle changes most recomputed (the rest keep
the cached KV, re-rotated for the needle's shift).

The response variants (fast mode's: the answer, the restated sentence or the distractor) run in the
same forward as branches after the prompt, so a trial is one pass over the needle, the question, the
recomputed share and the responses. Scores are approximate below a share of 1; at 1 every token after
the prefix is recomputed in every layer and the trial equals fast mode's up to float rounding. The log
records the mode and the share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..haystack.context import build_context, common_prefix_length
from ..haystack.corpus import Haystack
from ..haystack.needles import Needle
from .fast_mode import VariantResult, batch_records, build_batch
from .layer_scores import AnswerSpans, StepScorer, zero_totals
from .modes import check_recompute_share
from .prompt_cache import HaystackCaches
from .selective_prefill import Branches, check_reuse_model, plan_reuse, selective_trial_forward
from .trial_grid import TrialSpec

if TYPE_CHECKING:
    from ..models.loading import LoadedModel
    from .probe_config import NeedleProbeConfig, NeedleScores

@torch.no_grad()
def run_reuse_length_group(lm: LoadedModel, haystack: Haystack, needles: dict[str, Needle], length: int,
                           specs: list[TrialSpec], config: NeedleProbeConfig,
                           on_trial: Callable[[dict[str, Any]], None], progress: Callable[[int], None] | None,
                           caches: HaystackCaches | None = None) -> None:
    """Run the trials of one length and seed in reuse mode, one trial at a time.

    The haystack forward's time is shared out over the group's trials (as fast mode does with its prefix).
    """
    check_reuse_model(lm.model)
    check_recompute_share(config.recompute_share)
    caches = caches if caches is not None else HaystackCaches(keep=1)
    base_ids, base_cache, base_seconds = caches.get(lm, haystack, length, config.chat_template)
    for spec in specs:
        started = time.perf_counter()
        record = run_reuse_trial(lm, base_ids, base_cache, haystack, needles, spec, config)
        record["seconds"] = round(time.perf_counter() - started + base_seconds / len(specs), 3)
        on_trial(record)
        if progress:
            progress(1)


def run_reuse_trial(lm: LoadedModel, base_ids: list[int], base_cache, haystack: Haystack,
                    needles: dict[str, Needle], spec: TrialSpec, config: NeedleProbeConfig) -> dict[str, Any]:
    """One trial: its prompt and response variants in one selective forward; its log record."""
    tok, identity = lm.tokenizer, lm.identity
    needle = needles[spec.needle_id]
    ctx = build_context(tok, haystack, needle, spec.length, spec.depth, config.chat_template, identity.max_context)
    n = ctx.length
    shared = min(common_prefix_length(base_ids, ctx.input_ids), ctx.needle_span[0], n - 1)
    plan = plan_reuse(base_ids, ctx.input_ids, shared, ctx.needle_span[1], n)
    batch = build_batch(tok, [spec], [ctx], n - 1, needles)
    names = batch.variant_names
    branches = Branches([batch.variants[0].get(name, []) for name in names])
    scorer = BranchScorer(branches, names, batch.spans, config.scores, identity.num_layers, identity.num_query_heads)
    logp, recomputed = selective_trial_forward(lm.model, base_cache, ctx.input_ids, plan, config.recompute_share,
                                               branches, scorer)
    results = {}
    for v, name in enumerate(names):
        forced, rows = branches.forced[v], branches.step_rows(v)
        greedy = [int(logp[r].argmax()) for r in rows]
        likelihood = sum(float(logp[r, t]) for r, t in zip(rows, forced, strict=True))
        results[name] = VariantResult([forced], [greedy], [likelihood], scorer.totals[name])
    record = batch_records(tok, batch, results, mode="reuse")[0]
    record["recompute_share"] = config.recompute_share
    record["reuse"] = {"prefix": plan.prefix, "reused": plan.reused, "recomputed": recomputed, "shift": plan.shift}
    return record


class BranchScorer:
    """Row callback of :func:`~headprobe.probes.selective_prefill.selective_trial_forward`: hands each
    response's step rows (on the CPU) to its :class:`~headprobe.probes.layer_scores.StepScorer`, which adds
    them to the response's totals (``[1, layers, query_heads]`` per score name)."""

    def __init__(self, branches: Branches, names: list[str], spans: AnswerSpans, scores: NeedleScores, layers: int,
                 heads: int) -> None:
        self.branches = branches
        self.totals = {name: zero_totals(scores, 1, layers, heads) for name in names}
        self.scorers = {}                   # response index → its scorer (responses without tokens have none)
        for v, name in enumerate(names):
            steps = branches.step_rows(v)
            if steps:
                self.scorers[v] = StepScorer(self.totals[name], scores, spans, torch.tensor([branches.forced[v]]),
                                             torch.ones(1, len(steps), dtype=torch.bool))

    def __call__(self, layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        rows, key_positions = rows.cpu(), key_positions.cpu()
        for v, scorer in self.scorers.items():
            scorer(layer, rows[:, :, self.branches.step_rows(v)], key_positions)
