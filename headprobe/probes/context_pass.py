"""Probing a user's own documents: the retrieval scores on the real context, at the answer's own span.

Each example (:mod:`headprobe.haystack.contexts`) is a context, a question and an answer found in the
context; its prompt is the context in place of the haystack, then the question
(:func:`~headprobe.haystack.contexts.document_prompt`). No needle is inserted: the span scored is where
the answer already is. The ``contexts`` pass records, per example, Wu et al.'s copy score
(``context_retrieval``, :func:`~headprobe.probes.head_scores.copy_scores`) and the attention-weight score
(``context_enhanced_retrieval``, HeadKV-ER) of the answer's tokens at every step of the model's own
greedy response, as the retrieval needle pass scores a needle's answer; the gate is ROUGE-1 recall of the
answer in that response > 0.5. Reference mode decodes each example step by step, scoring as it goes; fast
mode decodes a batch of examples, then teacher-forces the decoded responses in one forward and scores its
rows at the response positions (the rows of decoding, computed in one pass), so both modes record the same
response, gate it alike and give the same scores up to float rounding.

The base class :class:`ContextPass` holds what every pass over a user's examples shares (its options,
reading the data once, the log's settings, sharding, early stopping, checking records, merging) and is
used by :mod:`headprobe.probes.query_focus_pass` too.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from ..attention.recorder import RowRecorder
from ..errors import FileFormatError, HeadprobeError, NoPassingTrialsError, param
from ..haystack.context import common_prefix_length
from ..haystack.contexts import ContextExample, ContextSet, DocumentPrompt, document_prompt, read_contexts
from ..haystack.needles import Needle
from ..models.cache_argument import with_cache
from ..models.identity import ModelIdentity
from ..profile import Profile, reduce_groups
from .aggregate import exact_head_means, require_field, require_numbers, stopping_block
from .bootstrap import BootstrapSettings, interval_block
from .early_stop import run_until_stable
from .fast_mode import build_batch, prompt_step, run_variant
from .layer_scores import AnswerSpans, zero_totals
from .log_settings import portable_file_name, shard_setting
from .pass_steps import PassSteps, TrialGap
from .probe_config import NeedleProbeConfig, NeedleScores
from .prompt_cache import batch_cache, crop_cache, prefix_cache
from .reference_mode import decode_scored_steps, eos_ids
from .registry import probe_passes
from .trial_grid import shard_samples
from .trial_record import trial_gates

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..files.trial_log import TrialLog
    from ..models.loading import LoadedModel
    from .fast_mode import FastBatch, VariantResult
    from .inputs import RunInputs
    from .pass_steps import PassPlan, PassRun, RunContext
    from .request import ProfileRequest


@dataclass
class ContextOptions:
    """Options of a pass over a user's examples (``--contexts``, ``--fields``; ``--pass-option PASS.FIELD=VALUE``).

    Attributes
    ----------
    file
        The examples: a ``.jsonl``/``.json``/``.csv``/``.parquet`` file or a dataset folder.
    fields
        Field names, ``context=NAME,question=NAME,answer=NAME[,answer_offset=NAME][,id=NAME]``
        (:class:`~headprobe.haystack.contexts.ContextFields`); roles left out keep their defaults.
    split
        The split of a folder holding several; ``None``: its only one (``--split``;
        :mod:`~headprobe.haystack.qa_data`'s split rule, as ``eval --task dataset`` reads a folder).
    limit
        Only the first ``limit`` rows.
    """

    file: Path
    fields: str = ""
    split: str | None = None
    limit: int | None = None


@dataclass(frozen=True)
class ContextInput:
    """What a pass over a user's examples reads: the examples, and their prompts once rendered."""

    data: ContextSet
    file: str
    prompts: dict[str, DocumentPrompt] = field(default_factory=dict, compare=False, hash=False)


def example_prompt(lm: LoadedModel, data: ContextInput, example: ContextExample,
                   chat_template: bool) -> DocumentPrompt:
    """``example``'s prompt on the loaded model's tokenizer (rendered once per run)."""
    prompt = data.prompts.get(example.id)
    if prompt is None:
        prompt = document_prompt(lm.tokenizer, example, chat_template)
        data.prompts[example.id] = prompt
    return prompt


class ContextPass(PassSteps):
    """What every pass over a user's examples shares; a subclass adds its runners, scores and records."""

    options = ContextOptions
    #: Whether ``--contexts`` feeds it (and ``--probe all`` with ``--contexts`` runs it).
    reads_contexts = True
    #: The optional request parameters it reads: none of the needle grid's (lengths, depths, seeds, needles,
    #: haystack, gate), which a request for these passes alone refuses.
    reads: frozenset[str] | None = frozenset({"group_reduction", "until_stable"})

    # ---- before the model loads --------------------------------------------------------------------

    def read(self, request: ProfileRequest, options: ContextOptions, inputs: RunInputs) -> ContextInput:  # noqa: ARG002 (the probe-pass interface)
        """The examples (read once per run, whichever passes read them)."""
        source = options.file
        path = Path(source)
        name = portable_file_name(path)[0] if path.exists() else str(source)
        data = read_contexts(source, options.fields or None, options.split, options.limit, name=name)
        return ContextInput(data, name)

    # ---- on the model ------------------------------------------------------------------------------

    def settings(self, lm: LoadedModel, plan: PassPlan, context: RunContext) -> dict[str, Any]:
        """Every example's prompt checked against the model's context; the log's settings."""
        request, data = context.request, plan.data
        max_context = lm.identity.max_context
        for example in data.data.examples:
            prompt = example_prompt(lm, data, example, request.chat_template)
            room = len(prompt.input_ids) + self.response_room(request)
            if max_context and room > max_context:
                raise HeadprobeError(f"{param('contexts', data.file)}: example {example.id}: its prompt is "
                                     f"{len(prompt.input_ids)} tokens, beyond the model's context of {max_context} "
                                     f"tokens{' with room for the response' if room > len(prompt.input_ids) else ''}; "
                                     f"shorten the context or leave the example out")
        out = {**context.common, "pass": plan.probe_pass.name, "probes": list(plan.probes),
               "contexts": data.data.to_json(), "example_ids": [e.id for e in data.data.examples],
               "shard": shard_setting(request.shard), **self.own_settings(request, plan)}
        if request.until_stable is not None:
            out["until_stable"] = request.until_stable.to_json()
        return out

    def response_room(self, request: ProfileRequest) -> int:  # noqa: ARG002 (the probe-pass interface)
        """Tokens the pass adds after a prompt (checked against the model's context)."""
        return 0

    def own_settings(self, request: ProfileRequest, plan: PassPlan) -> dict[str, Any]:  # noqa: ARG002 (the probe-pass interface)
        """The pass's own entries of the log's settings."""
        return {}

    def trials(self, run: PassRun) -> list[ContextExample]:
        return shard_samples(list(run.plan.data.data.examples), run.request.shard)

    def progress_label(self, run: PassRun) -> str:
        return f"{'+'.join(run.settings['probes'])} on {run.plan.data.file} ({run.request.mode})"

    def run(self, lm: LoadedModel, run: PassRun, todo: list[ContextExample], log: TrialLog,
            progress: Any) -> Any:
        """Run ``todo``; with ``until_stable``, the examples in a seeded shuffle until the top heads are stable."""
        chunk_runner = self.chunk_runner(lm, run, log, progress)
        rule = run.request.until_stable
        if rule is None:
            chunk_runner(todo)
            return None

        order = list(run.plan.data.data.examples)
        random.Random(rule.order_seed).shuffle(order)
        gates = {kind: self.gate for kind in self.score_kinds(run.settings)}
        return run_until_stable(order, log.done, chunk_runner, gates, rule)

    def chunk_runner(self, lm: LoadedModel, run: PassRun, log: TrialLog,
                     progress: Any) -> Callable[[list[ContextExample]], None]:
        """A function that runs a list of examples, appending each record to ``log``."""
        raise NotImplementedError

    # ---- logs into profiles ------------------------------------------------------------------------

    #: The gate a record must pass to count (``"none"``: every example counts).
    gate = "published"
    #: Whether a profile clips negative mean scores to 0 (allocation reads non-negative scores).
    clip_negative = False

    def profiles(self, settings: dict[str, Any], records: list[dict[str, Any]]) -> list[Profile]:
        identity = ModelIdentity.from_json(settings["model"], "<trial log>")
        return [example_profile(kind, identity, settings, records, self.gate, self.clip_negative)
                for kind in self.score_kinds(settings)]

    def check_records(self, settings: dict[str, Any], records: list[tuple[str, dict[str, Any]]]) -> None:
        """A record needs an id among the log's examples, its gates and a ``[layers][query_heads]`` matrix of
        finite numbers per score kind (non-negative unless the pass's scores are signed)."""
        identity = ModelIdentity.from_json(settings["model"], "<trial log>")
        shape = [identity.num_layers, identity.num_query_heads]
        ids = set(settings.get("example_ids", []))
        for where, r in records:
            require_field(r, "gates", dict, where)
            require_field(r, "scores", dict, where)
            if r["trial"] not in ids:
                raise FileFormatError(where, "trial", f"{r['trial']!r} is not an example of the log's settings")
            if not isinstance(r["gates"].get(self.gate), bool):
                raise FileFormatError(where, f"gates.{self.gate}", f"expected true or false, found "
                                      f"{r['gates'].get(self.gate)!r}")
            for kind in self.score_kinds(settings):
                require_numbers(r["scores"].get(kind), shape, where, f"scores.{kind}", signed=self.clip_negative)

    def missing_trials(self, settings: dict[str, Any], found: dict[str, str], shards: list[list[int]]) -> TrialGap:  # noqa: ARG002 (the probe-pass interface)
        """The examples the settings name that no log holds."""
        ids = list(settings.get("example_ids", []))
        missing = [i for i in ids if i not in found]
        shown = f" (first: {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})" if missing else ""
        return TrialGap(len(missing), missing, f"{len(missing)} of {len(ids)} examples are missing{shown}")


def example_profile(kind: str, identity: ModelIdentity, settings: dict[str, Any], records: list[dict[str, Any]],
                    gate: str, clip_negative: bool = False) -> Profile:
    """The profile of one score kind of a log of examples: the mean over the examples that passed ``gate``,
    with bootstrap intervals; ``trials`` counts the examples run, those that passed, and the rows left out
    because their answer is not in their context.

    Parameters
    ----------
    clip_negative
        Signed scores (QRHead's calibrated score): the mean, and the interval bounds, are clipped at 0, so
        that a head that attends less to the evidence when asked scores 0 (``probe.clipped_heads`` counts
        them); the log keeps the signed values.

    Raises
    ------
    NoPassingTrialsError
        No example passed the gate.
    """
    passed = [r for r in records if r["gates"].get(gate)]
    contexts = settings.get("contexts", {})
    if not passed:
        raise NoPassingTrialsError(
            f"{kind}: none of the {len(records)} examples passed the {gate} gate (the model's answer, ROUGE-1 "
            f"recall > 0.5), so there is nothing to average; see the responses in the trial log")
    layers, heads = identity.num_layers, identity.num_query_heads
    per_trial = np.array([r["scores"][kind] for r in passed], dtype=np.float64)    # [passed, layers, heads]
    mean = exact_head_means(per_trial.tolist(), layers, heads)
    probe = {k: v for k, v in settings.items() if k != "probes"}
    probe["kind"] = kind
    intervals = interval_block(per_trial, BootstrapSettings())
    clipped = sum(1 for row in mean for x in row if x < 0)
    if clip_negative:
        mean = [[max(0.0, x) for x in row] for row in mean]
        for key in ("low", "high"):
            intervals[key] = [[max(0.0, x) for x in row] for row in intervals[key]]
    trials: dict[str, Any] = {
        "total": len(records), "passed": len(passed),
        **({"gate": gate, "passed_by_gate": {gate: len(passed)}} if gate != "none" else {}),
        "rows": int(contexts.get("rows", len(records))),
        "answer_not_in_context": int(contexts.get("answer_not_in_context", 0)),
        "mean_seconds": round(math.fsum(r.get("seconds", 0.0) for r in records) / len(records), 3)}
    if clip_negative:
        trials["clipped_heads"] = clipped
    if settings.get("until_stable"):
        examples = len(settings.get("example_ids", []))
        trials["stopping"] = stopping_block(settings, len(records), examples, per_trial)
    reduction = settings.get("group_reduction", "mean")
    return Profile(kind=kind, model=identity, probe=probe, trials=trials, query_heads=mean,
                   kv_heads=reduce_groups(mean, identity.group_size, reduction), group_reduction=reduction,
                   intervals=intervals)


def context_probes() -> dict[str, str]:
    """Profile kind → pass name of every registered pass that reads a user's examples (``--contexts``)."""
    return {kind: p.name for p in probe_passes() if getattr(p.implementation, "reads_contexts", False)
            for kind in p.kinds}


# ---- the retrieval scores on the real context ----------------------------------------------------------

def example_needle(example: ContextExample) -> Needle:
    """The example as the needle runners see one: its answer's sentence up to the answer (the restated
    response) is the "needle", so the responses teacher-forced are those of a retrieval needle."""
    return Needle(example.id, "retrieval", example.answer_sentence(), example.question, example.answer)


def record_of(example: ContextExample, prompt: DocumentPrompt, response: str, scores: dict[str, torch.Tensor],
              gates: dict[str, Any], passed: bool, seconds: float, mode: str) -> dict[str, Any]:
    """One line of the trial log: the example, where its answer is, the model's response, gates and scores
    (``[layers][query_heads]``, rounded to 6 decimals)."""
    return {"trial": example.id, "mode": mode, "prompt_tokens": len(prompt.input_ids),
            "answer_span": list(prompt.context.answer_span), "response": response, "gates": gates,
            "passed": passed,
            "scores": {k: [[round(float(x), 6) for x in row] for row in v.tolist()] for k, v in scores.items()},
            "seconds": round(seconds, 3)}


@torch.no_grad()
def run_fast_examples(lm: LoadedModel, data: ContextInput, examples: list[ContextExample],
                      config: NeedleProbeConfig, on_trial: Callable[[dict[str, Any]], None],
                      progress: Any) -> None:
    """Fast mode: examples in batches of similar length (``config.batch_size``), the tokens their prompts
    share at the start (the chat template's) computed once per batch. Each batch decodes its responses
    greedily, as reference mode does (:func:`decode_batch`), then teacher-forces them in one forward whose
    rows at the response positions are scored; the gate is computed on the decoded response. Each batch's
    records go to ``on_trial`` before the next batch starts."""
    prompts = {e.id: example_prompt(lm, data, e, config.chat_template) for e in examples}
    lengths = [len(prompts[e.id].input_ids) for e in examples]
    for batch in example_batches(lengths, config.batch_size, lm.identity.sliding_window, config.max_new_tokens):
        began = time.perf_counter()
        members = [examples[i] for i in batch]
        responses, result = _run_fast_batch(lm, [prompts[e.id] for e in members], members, config)
        seconds = (time.perf_counter() - began) / len(members)
        for i, example in enumerate(members):
            response = lm.tokenizer.decode(responses[i], skip_special_tokens=True)
            gates, passed = trial_gates(example_needle(example), response, None, None)
            scores = {name: total[i] for name, total in result.totals.items()}
            on_trial(record_of(example, prompts[example.id], response, scores, gates, passed, seconds, "fast"))
        if progress:
            progress(len(members))


def example_batches(lengths: list[int], batch_size: int, window: int | None, room: int) -> list[list[int]]:
    """Indices of the examples, by prompt length (``lengths``), in batches of at most ``batch_size``.

    With sliding-window layers (``window`` tokens), prompts of different lengths share a batch only while
    the longest of them with its response (``room`` tokens) fits in the window: the prompts are
    right-padded, and the mask of those layers counts cache slots, not positions, so past the window the
    padding would shift the window of a shorter prompt's response tokens. Longer prompts go in batches of
    one length, which hold no padding.
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        last = batches[-1] if batches else None
        if last and len(last) < batch_size and (window is None or lengths[i] == lengths[last[0]]
                                                or lengths[i] + room <= window):
            last.append(i)
        else:
            batches.append([i])
    return batches


def _run_fast_batch(lm: LoadedModel, prompts: list[DocumentPrompt], members: list[ContextExample],
                    config: NeedleProbeConfig) -> tuple[list[list[int]], VariantResult]:
    """One batch of fast mode: the prompt forward, greedy decoding, and the decoded responses teacher-forced
    and scored. Returns each example's response tokens and the scores of their steps."""
    identity, device = lm.identity, lm.device
    contexts = [p.context for p in prompts]
    shared = min(min(common_prefix_length(contexts[0].input_ids, c.input_ids), c.answer_span[0], c.length - 1)
                 for c in contexts)
    batch = build_batch(lm.tokenizer, members, contexts, shared, {e.id: example_needle(e) for e in members})
    cache = batch_cache(prefix_cache(lm.model, contexts[0].input_ids[:shared], device), shared, batch.size)
    with RowRecorder(lm.model) as rec:
        step0 = prompt_step(lm.model, rec, batch, cache, config.split_attention and shared > 0,
                            identity.num_layers, identity.num_query_heads, device)
        rec.request = None
        responses = decode_batch(lm.model, batch, cache, step0.logp, config.max_new_tokens, eos_ids(lm),
                                 device)
        batch.variants = [{"response": tokens} for tokens in responses]
        result = run_variant(lm.model, rec, batch, cache, step0, "response", config.scores,
                             identity.num_layers, identity.num_query_heads, device)
    return responses, result


def decode_batch(model: PreTrainedModel, batch: FastBatch, cache: Any, first_logp: torch.Tensor, steps: int, eos: set[int],
                 device: torch.device) -> list[list[int]]:
    """Greedy decoding of every prompt of ``batch`` after its prompt forward, by reference mode's rule: at
    most ``steps`` tokens, an end-of-sequence token ends a response and is not part of it.

    Parameters
    ----------
    cache
        The batch's cache after the prompt forward (``batch.total`` positions, prompts right-padded); the
        decoded tokens go after it, and it is cut back to ``batch.total`` positions after.
    first_logp
        ``[batch, vocab]`` log-probabilities of each response's first token (the prompt forward's).

    Returns
    -------
    list[list[int]]
        Each prompt's decoded tokens, without the end-of-sequence token.
    """
    tokens = first_logp.argmax(dim=-1).tolist()
    responses: list[list[int]] = [[] for _ in range(batch.size)]
    live = [True] * batch.size
    mask = batch.attention
    for step in range(steps):
        for b, token in enumerate(tokens):
            live[b] = live[b] and token not in eos
            if live[b]:
                responses[b].append(token)
        if step == steps - 1 or not any(live):
            break
        ids = torch.tensor([[t if alive else batch.pad_id] for t, alive in zip(tokens, live, strict=True)])
        mask = torch.cat([mask, torch.tensor([[int(alive)] for alive in live])], dim=1)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=True,
                    position_ids=(batch.prompt_len[:, None] + step).to(device), logits_to_keep=1,
                    **with_cache(model, cache))
        tokens = out.logits[:, -1].argmax(dim=-1).tolist()
    crop_cache(cache, batch.total)
    return responses


@torch.no_grad()
def run_reference_examples(lm: LoadedModel, data: ContextInput, examples: list[ContextExample],
                           config: NeedleProbeConfig, on_trial: Callable[[dict[str, Any]], None],
                           progress: Any) -> None:
    """Reference mode: each example by greedy decoding (``config.max_new_tokens`` steps or end of sequence),
    every step's rows scored, as the retrieval needle pass does."""
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import DynamicCache

    identity = lm.identity
    for example in examples:
        began = time.perf_counter()
        prompt = example_prompt(lm, data, example, config.chat_template)
        ids = torch.tensor([prompt.input_ids])
        spans = AnswerSpans(torch.tensor([prompt.context.answer_span[0]]),
                            torch.tensor([prompt.context.answer_span[1]]), ids)
        totals = zero_totals(config.scores, 1, identity.num_layers, identity.num_query_heads)
        generated = decode_scored_steps(lm, ids, config.max_new_tokens, DynamicCache(), spans, config.scores,
                                        totals)
        response = lm.tokenizer.decode(generated, skip_special_tokens=True)
        gates, passed = trial_gates(example_needle(example), response, None, None)
        scores = {name: total[0] for name, total in totals.items()}
        on_trial(record_of(example, prompt, response, scores, gates, passed, time.perf_counter() - began,
                           "reference"))
        if progress:
            progress(1)


class ContextRetrievalPass(ContextPass):
    """The retrieval scores of the answer's span in the user's own contexts."""

    kinds = ("context_retrieval", "context_enhanced_retrieval")
    runners: ClassVar[Mapping[str, Any]] = {"fast": run_fast_examples, "reference": run_reference_examples}
    scores = NeedleScores(weight="context_enhanced_retrieval", copy="context_retrieval")
    reads = frozenset({"group_reduction", "until_stable", "batch_size", "split_attention"})

    def response_room(self, request: ProfileRequest) -> int:
        return request.max_new_tokens                       # both modes decode the response

    def own_settings(self, request: ProfileRequest, plan: PassPlan) -> dict[str, Any]:  # noqa: ARG002 (the probe-pass interface)
        """The gate and the decoding limit; fast mode also ``"scored": "decoded_response"`` (what it scores),
        so that a log whose fast-mode records scored teacher-forced forms of the answer is not resumed."""
        scored = {"scored": "decoded_response"} if request.mode == "fast" else {}
        return {"gate": "published", "max_new_tokens": request.max_new_tokens, **scored}

    def chunk_runner(self, lm: LoadedModel, run: PassRun, log: TrialLog,
                     progress: Any) -> Callable[[list[ContextExample]], None]:
        request = run.request
        config = NeedleProbeConfig(scores=self.scores, mode=request.mode, chat_template=request.chat_template,
                                   batch_size=request.batch_size, max_new_tokens=request.max_new_tokens,
                                   split_attention=request.split_attention)
        runner = self.runner(request.mode)
        return lambda examples: runner(lm, run.plan.data, examples, config, log.append, progress)


#: The pass over a user's examples that scores the answer's span as the retrieval needle pass does.
CONTEXTS = ContextRetrievalPass()
