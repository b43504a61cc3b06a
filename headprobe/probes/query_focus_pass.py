"""The query-focus pass: how much each head's question tokens attend to the evidence, QRHead's score.

Query-focused retrieval heads (QRHead; Zhang et al., 2025, "Query-Focused Retrieval Heads Improve
Long-Context Reasoning and Re-ranking") are found without generating anything: for each example, the
attention from the query's tokens to the tokens of the gold evidence. Per example and head, as QRHead's
detection code computes it (``score_docs_per_head_for_detection`` and ``score_per_token_attention_to_query``
of its ``attn_retriever.py``):

1. one forward over the prompt (the user's context, then the question, the answer instruction and the
   template's end); each head's post-softmax attention rows of the *query tokens* (every token after the
   document: the question, the instruction and the template's end, as QRHead's query span holds its
   instruction, query and template suffix) are averaged over those tokens, ``a[h, j]`` for key ``j``;
2. calibration: the same with the question replaced by the content-free query ``N/A`` (the cache of the
   tokens before the query reused, only the null query's tokens run), ``a0[h, j]``; the calibrated score of
   a key token is ``a[h, j] - a0[h, j]``;
3. over the evidence span (the answer's tokens in the context), tokens whose calibrated score is not above
   ``mean - 2 std`` of the span (per head, unbiased std) are dropped as outliers and the rest summed: the
   example's score of the head. A one-token span keeps its token (QRHead's std of one value is undefined
   and would drop it).

The profile (``query_focus``) is the mean over examples (every example counts: there is no gate), with
bootstrap intervals; heads whose mean is negative (they attend less to the evidence when asked than for
``N/A``) score 0 so that allocation can read it (``trials.clipped_heads`` counts them; the trial log keeps
the signed scores). QRHead then ranks heads by this mean over (question, gold document) pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..attention.recorder import RowRecorder, RowRequest
from ..errors import HeadprobeError, param
from ..haystack.contexts import ContextExample, document_prompt
from ..models.cache_argument import with_cache
from .context_pass import ContextInput, ContextOptions, ContextPass, example_prompt
from .modes import MODES
from .prompt_cache import crop_cache

if TYPE_CHECKING:
    from ..files.trial_log import TrialLog
    from ..models.loading import LoadedModel
    from .pass_steps import PassPlan, PassRun
    from .request import ProfileRequest

#: QRHead's content-free query for calibration.
NULL_QUERY = "N/A"


@dataclass
class QueryFocusOptions(ContextOptions):
    """The examples (as for every pass over a user's examples) and the calibration query.

    Attributes
    ----------
    null_query
        The content-free query whose attention is subtracted (QRHead's ``N/A``); empty: no calibration.
    """

    null_query: str = NULL_QUERY


def evidence_scores(mean_rows: torch.Tensor, null_rows: torch.Tensor | None) -> torch.Tensor:
    """QRHead's per-head score of one example from the query tokens' mean attention to the evidence.

    Parameters
    ----------
    mean_rows
        ``[query_heads, span]`` attention to each evidence token, averaged over the query tokens.
    null_rows
        ``[query_heads, span]`` the same for the null query, or ``None`` (no calibration).

    Returns
    -------
    torch.Tensor
        ``[query_heads]`` float64: the calibrated scores summed over the span's tokens, those not above
        ``mean - 2 std`` of the span left out (spans of two tokens or more).
    """
    calibrated = mean_rows.to(torch.float64)
    if null_rows is not None:
        calibrated = calibrated - null_rows.to(torch.float64)
    if calibrated.shape[-1] < 2:
        return calibrated.sum(dim=-1)
    threshold = calibrated.mean(dim=-1, keepdim=True) - 2 * calibrated.std(dim=-1, keepdim=True)
    return (calibrated * (calibrated > threshold)).sum(dim=-1)


def _mean_rows_to_span(store: dict[int, torch.Tensor], start: int, end: int) -> Callable[..., None]:
    """A row-recorder callback: per layer, the rows ``[1, heads, n_query, keys]`` averaged over the query
    tokens and read at the evidence positions ``[start, end)`` (0 where a sliding window hides one)."""
    def keep(layer: int, rows: torch.Tensor, key_positions: torch.Tensor) -> None:
        positions = key_positions.reshape(-1)
        mean = rows[0].to(torch.float64).mean(dim=1)                 # [heads, keys]
        out = torch.zeros(mean.shape[0], end - start, dtype=torch.float64, device=mean.device)
        inside = (positions >= start) & (positions < end)
        out[:, (positions[inside] - start).long()] = mean[:, inside]
        store[layer] = out.cpu()
    return keep


@torch.no_grad()
def query_focus_record(lm: LoadedModel, data: ContextInput, example: ContextExample, chat_template: bool,
                       null_query: str) -> dict[str, Any]:
    """One example's log record: ``scores.query_focus[layer][query_head]`` (signed), the evidence span and
    the query tokens."""
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import DynamicCache

    began = time.perf_counter()
    model, device = lm.model, lm.device
    prompt = example_prompt(lm, data, example, chat_template)
    ids, q_start = prompt.input_ids, prompt.query_start
    start, end = prompt.context.answer_span
    real: dict[int, torch.Tensor] = {}
    null: dict[int, torch.Tensor] = {}
    cache = DynamicCache()
    with RowRecorder(model) as rec:
        rec.request = RowRequest(torch.arange(q_start, len(ids))[None].to(device), 0,
                                 _mean_rows_to_span(real, start, end))
        model(input_ids=torch.tensor([ids], device=device), use_cache=True, logits_to_keep=1,
              **with_cache(model, cache))
        if null_query:
            null_ids = document_prompt(lm.tokenizer, example, chat_template, question=null_query).input_ids
            if null_ids[:q_start] == ids[:q_start]:        # the tokens before the query are the prompt's
                crop_cache(cache, q_start)
                block, inputs = q_start, null_ids[q_start:]
            else:
                cache, block, inputs = DynamicCache(), 0, null_ids
            rec.request = RowRequest(torch.arange(q_start, len(null_ids))[None].to(device), block,
                                     _mean_rows_to_span(null, start, end))
            model(input_ids=torch.tensor([inputs], device=device), use_cache=True, logits_to_keep=1,
                  position_ids=torch.arange(block, len(null_ids), device=device)[None], **with_cache(model, cache))
    layers = sorted(real)
    scores = torch.stack([evidence_scores(real[layer], null.get(layer)) for layer in layers])
    return {"trial": example.id, "prompt_tokens": len(ids), "answer_span": [start, end],
            "query_tokens": len(ids) - q_start, "gates": {"none": True}, "passed": True,
            "scores": {"query_focus": [[round(float(x), 6) for x in row] for row in scores.tolist()]},
            "seconds": round(time.perf_counter() - began, 3)}


class QueryFocusPass(ContextPass):
    """QRHead's query-focus score over a user's examples: one forward (and the null query's tokens) each."""

    kinds = ("query_focus",)
    runners: ClassVar[Mapping[str, Any]] = dict.fromkeys(MODES, query_focus_record)
    options = QueryFocusOptions
    gate = "none"
    clip_negative = True

    def read(self, request: ProfileRequest, options: QueryFocusOptions, inputs: Any) -> ContextInput:
        if options.null_query and not options.null_query.strip():
            raise HeadprobeError(f"{param('options', 'query_focus.null_query')}: expected a query (or nothing, "
                                 "for no calibration)")
        return super().read(request, options, inputs)

    def own_settings(self, request: ProfileRequest, plan: PassPlan) -> dict[str, Any]:  # noqa: ARG002 (the probe-pass interface)
        return {"null_query": plan.options.null_query, "score": "qrhead"}

    def chunk_runner(self, lm: LoadedModel, run: PassRun, log: TrialLog,
                     progress: Any) -> Callable[[list[ContextExample]], None]:
        record = self.runner(run.request.mode)
        null_query = run.plan.options.null_query

        def run_chunk(examples: list[ContextExample]) -> None:
            for example in examples:
                log.append(record(lm, run.plan.data, example, run.request.chat_template, null_query))
                if progress:
                    progress(1)
        return run_chunk


#: The query-focus pass (QRHead).
QUERY_FOCUS = QueryFocusPass()
