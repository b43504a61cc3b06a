"""Many settings of one prompt, decoded together: one forward per decode step for every cache that decodes
alike.

Comparing settings on one prompt (``headprobe eval``, ``tune``) already shares the prompt's forward
(:mod:`headprobe.runtime.shared_prefill`); what is left is decoding, one token at a time for every setting.
:func:`generate_settings` builds each setting's compressed cache from the recorded prefill, then stacks
the caches whose policies decode alike (:meth:`CompressedCache.decode_key`: the append-only policies,
whatever their per-head budgets, in one batch; StreamingLLM's constant-size caches with the same sink in
another) into one cache whose batch rows are the settings (:meth:`CompressedCache.stack`), and lets
transformers' ``generate`` decode all rows at once. Each row keeps its own per-head budgets, pairs and decode
room; a row stops at its end of answer (:class:`~headprobe.runtime.answer_stop.AnswerStop`) and its cache
stops changing there, so every setting gets the tokens, cache bytes and kept tokens it gets decoded alone
(a test checks it token for token). Policies that rewrite the cache while decoding (MorphKV, KeepKV) decode
alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..models.loading import generation_eos_ids
from .answer_stop import AnswerStop, decode_rest
from .cache import CompressedCache, headprobe_attention
from .generate import DEFAULT_POLICY, GenerationResult, finish, new_cache
from .policies.base import Policy
from .shared_prefill import RecordedPrefill, check_replay, first_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..models.loading import ModelLike


@dataclass(frozen=True)
class CacheSetting:
    """The cache of one setting: the budget arguments of :func:`~headprobe.runtime.generate.generate_compressed`."""

    policy: str | Policy = DEFAULT_POLICY
    budget: Any = None
    ratio: float | None = None
    capacity: int | None = None
    policy_options: dict[str, Any] | None = None


@dataclass
class SettingGeneration:
    """One setting's answer from :func:`generate_settings`.

    Attributes
    ----------
    result
        What :func:`~headprobe.runtime.shared_prefill.generate_from_prefill` returns for the setting alone
        (sequences, answers, its own cache).
    seconds
        Building its cache from the prefill plus its share of the decode it was part of (the decode's wall
        time over the caches in it, shared again among twins); the prompt forward is not included.
    batch_settings
        Caches decoded in the same batch (1: alone).
    twin
        The index of an earlier setting whose cache keeps exactly what this one keeps (:func:`same_caches`):
        the answer and the cache are that setting's, and the time is shared with it. ``None`` otherwise.
    """

    result: GenerationResult
    seconds: float
    batch_settings: int
    twin: int | None = None


def decode_batches(caches: list[CompressedCache]) -> list[list[int]]:
    """Indices of ``caches`` grouped by :meth:`~CompressedCache.decode_key`, in first-seen order; a cache
    without a key is a group of its own."""
    groups: dict[Any, list[int]] = {}
    alone: list[list[int]] = []
    for i, cache in enumerate(caches):
        key = cache.decode_key()
        if key is None:
            alone.append([i])
        else:
            groups.setdefault(key, []).append(i)
    return sorted([*groups.values(), *alone], key=lambda g: g[0])


@torch.no_grad()
def generate_settings(model: ModelLike, prefill: RecordedPrefill, settings: list[CacheSetting], *, tokenizer: Any = None,
                      max_new_tokens: int = 64, stop_at_line: bool = False,
                      batched: bool = True) -> list[SettingGeneration]:
    """Generate from one recorded prefill under every setting, the settings that decode alike in one batch.

    Parameters
    ----------
    model
        The model :func:`~headprobe.runtime.shared_prefill.record_prefill` ran.
    prefill
        The record (not modified); its prompt ``[batch, prompt_len]`` is every setting's.
    settings
        One :class:`CacheSetting` each.
    max_new_tokens, stop_at_line
        As for :func:`~headprobe.runtime.shared_prefill.generate_from_prefill`.
    batched
        ``False`` decodes each setting alone (the reference the batched decode is measured against).

    Returns
    -------
    list of SettingGeneration
        In the order of ``settings``; each result equals ``generate_from_prefill`` for that setting alone.
    """
    hf_model, tokenizer = check_replay(model, tokenizer, max_new_tokens, {})
    ids, mask = prefill.input_ids, prefill.attention_mask
    start = first_tokens(prefill)
    stop_rule = (tokenizer, ids.shape[1], generation_eos_ids(hf_model, tokenizer), stop_at_line)
    out: list[SettingGeneration | None] = [None] * len(settings)
    with headprobe_attention(hf_model):           # refuses a model the cache cannot run, first
        caches = [new_cache(model, s.policy, s.budget, s.ratio, s.capacity, s.policy_options, max_new_tokens, mask)
                  for s in settings]
        twin = same_caches(caches, mask.long().sum(1)) if batched else list(range(len(caches)))
        unique = [i for i, t in enumerate(twin) if t == i]
        build_seconds = {}
        for i in unique:
            begin = time.perf_counter()
            caches[i].compress_prompt(prefill.layers)
            build_seconds[i] = time.perf_counter() - begin
        probe = AnswerStop(*stop_rule)
        ended = max_new_tokens == 1 or all(probe.row_done(row) for row in start)
        groups = decode_batches([caches[i] for i in unique]) if batched else [[k] for k in range(len(unique))]
        for group in ([unique[k] for k in g] for g in groups):
            begin = time.perf_counter()
            members = [caches[i] for i in group]
            if ended:
                sequences = [start] * len(group)
            elif len(group) == 1:
                stop = AnswerStop(*stop_rule)
                sequences = [decode_rest(hf_model, tokenizer, members[0], start, mask, max_new_tokens - 1, {}, stop)]
            else:
                sequences = _decode_stacked(hf_model, tokenizer, members, start, mask, max_new_tokens, stop_rule)
            share = (time.perf_counter() - begin) / len(group)
            for i, seq in zip(group, sequences, strict=True):
                out[i] = SettingGeneration(finish(tokenizer, seq, ids.shape[1], caches[i]),
                                           build_seconds[i] + share, len(group))
    return _share_twins(out, twin)


def same_caches(caches: list[CompressedCache], prompt_lengths: torch.Tensor) -> list[int]:
    """Per cache, the first cache that keeps exactly what it keeps (itself when none before it does): the
    same policy with the same options (sliding layers' too) and the same resolved per-head budgets. Settings
    that differ only in how their budgets were written (a capacity, a uniform map, an allocation that
    clamps to the same budgets) then compress and decode once."""
    first: dict[tuple[Any, ...], int] = {}
    twin = []
    for i, cache in enumerate(caches):
        budgets = cache.budget.resolve(cache.shape, prompt_lengths, cache.policy)
        key = (repr(cache.policy), repr(cache.sliding_policy), tuple(budgets.shape),
               budgets.cpu().numpy().tobytes())
        twin.append(first.setdefault(key, i))
    return twin


def _share_twins(out: list[SettingGeneration | None], twin: list[int]) -> list[SettingGeneration]:
    """Give every setting whose cache is another's twin that one's result; the time is shared among them."""
    copies: dict[int, int] = {}
    for t in twin:
        copies[t] = copies.get(t, 0) + 1
    done = []
    for i, t in enumerate(twin):
        made = out[t]
        done.append(SettingGeneration(made.result, made.seconds / copies[t], made.batch_settings, twin=t if t != i
                                      else None))
    return done


def _decode_stacked(hf_model: PreTrainedModel, tokenizer: Any, caches: list[CompressedCache], start: torch.Tensor,
                    mask: torch.Tensor, max_new_tokens: int, stop_rule: tuple[Any, ...]) -> list[torch.Tensor]:
    """Decode ``caches`` (one decode key) as the rows of one stacked cache; gives each cache its rows back
    as they stand when its own rows finished. Returns each cache's sequences ``[batch, columns]``, as long as
    its own decode would have made them.

    Finished rows leave the batch: ``generate`` pauses once half of the settings still decoding have finished
    (:class:`AnswerStop` ``pause_after``), the finished ones take their rows back, the others are stacked again
    and decode on from where they stood (the cache holds every token but the last, as ``generate`` leaves it).
    """
    rows, limit = start.shape[0], start.shape[1] + max_new_tokens - 1
    active = list(range(len(caches)))
    sequences = start.repeat(len(caches), 1)
    done: dict[int, torch.Tensor] = {}
    merged = CompressedCache.stack(caches)
    while active:
        groups = [(j * rows, rows) for j in range(len(active))]
        stop = AnswerStop(*stop_rule, groups=groups, on_finish=merged.freeze_rows,
                          pause_after=(len(active) + 1) // 2 if len(active) > 1 else None)
        sequences = decode_rest(hf_model, tokenizer, merged, sequences, mask.repeat(len(active), 1),
                                limit - sequences.shape[1], {}, stop)
        ended = not stop.paused or sequences.shape[1] >= limit
        finished = [j for j in range(len(active)) if ended or j in stop.finished]
        for j in finished:                            # each finished setting takes its rows back
            length = stop.finished.get(j, sequences.shape[1])
            done[active[j]] = sequences[j * rows:(j + 1) * rows, :length]
            merged.give_rows(caches[active[j]], j * rows, length - 1 if j in stop.finished else None)
        going = [j for j in range(len(active)) if j not in finished]
        if going:                                     # the others decode on without them
            merged.keep_rows([j * rows + r for j in going for r in range(rows)])
            sequences = torch.cat([sequences[j * rows:(j + 1) * rows] for j in going])
        active = [active[j] for j in going]
    for layer in merged.layers:
        layer.release()
    return [done[k] for k in range(len(caches))]
