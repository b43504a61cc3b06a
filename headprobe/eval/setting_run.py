"""One setting run on one prompt, and what it is measured by: answer, real cache bytes, time, new tokens.

Every eval task (needle grids, bAbI, long generation, outside datasets) generates through
:func:`run_setting`, so bytes, time and new tokens mean the same in all of them and ``ms_per_token``
compares across tasks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from ..errors import HeadprobeError
from ..library_bridges.press_settings import KVPRESS, run_press
from ..runtime.generate import generate_compressed
from ..runtime.policies import POLICIES
from ..runtime.settings_batch import CacheSetting, generate_settings
from ..runtime.shared_prefill import generate_from_prefill
from .settings import EvalSetting

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


@dataclass(frozen=True)
class SettingRun:
    """What one generation under a setting produced and cost.

    Attributes
    ----------
    text
        The decoded answer.
    new_tokens
        Tokens generated (:func:`count_new_tokens`).
    cache_bytes, used_bytes, full_cache_bytes
        Bytes the compressed cache allocated, bytes of the key/value pairs it holds, and a full cache's
        bytes for the same tokens.
    seconds
        Wall time of the generation, the prompt forward included (also when it was shared).
    shared_prefill
        The prompt forward was a recorded one shared with other settings.
    batch_settings
        Settings decoded together in one batch with this one (1: decoded alone); ``seconds`` then holds
        this setting's share of that decode (:func:`run_settings`).
    same_cache_as
        The label of an earlier setting whose cache keeps exactly the same tokens (same policy, options and
        per-head budgets): this answer is that one's, generated once, and the time is shared.
    """

    text: str
    new_tokens: int
    cache_bytes: int
    used_bytes: int
    full_cache_bytes: int
    seconds: float
    shared_prefill: bool = False
    press: dict[str, Any] | None = None
    batch_settings: int = 1
    same_cache_as: str | None = None

    def measurements(self) -> dict[str, Any]:
        """The fields every trial record carries (besides the answer and its score); a kvpress setting's
        also carry ``compression_ratio`` and ``attended_tokens``
        (:mod:`headprobe.library_bridges.press_settings`)."""
        return {"cache_bytes": self.cache_bytes, "used_bytes": self.used_bytes,
                "full_cache_bytes": self.full_cache_bytes, "seconds": round(self.seconds, 4),
                "new_tokens": self.new_tokens, "shared_prefill": self.shared_prefill,
                "batch_settings": self.batch_settings, **(self.press or {}),
                **({"same_cache_as": self.same_cache_as} if self.same_cache_as else {})}


def count_new_tokens(tokens: list[int], eos_token_id: int | None, pad_token_id: int | None) -> int:
    """The generated tokens a trial is charged for, at least 1.

    Pad tokens are not counted; of the rest, those up to and including the first ``eos_token_id``. (With
    a tokenizer whose pad token is its end-of-sequence token, as SmolLM2's, the final EOS is thus not
    counted.)

    Parameters
    ----------
    tokens
        ``[new]`` generated ids of one sequence.
    """
    new = [t for t in tokens if t != pad_token_id]
    n = len(new) if eos_token_id is None or eos_token_id not in new else new.index(eos_token_id) + 1
    return max(n, 1)


def shares_prefill(setting: EvalSetting) -> bool:
    """Whether the setting's policy prefills with plain attention (one recorded forward serves it)."""
    return setting.policy != KVPRESS and bool(POLICIES[setting.policy].full_prefill)


def run_settings(lm: LoadedModel, input_ids: list[int], runs: list[tuple[EvalSetting, Any]], max_new_tokens: int,
                 prefill: Any = None, question_span: tuple[int, int] | None = None,
                 stop_at_line: bool = False) -> list[SettingRun]:
    """Answer one prompt under every setting: with a recorded prefill, the settings it serves decode together
    (:func:`~headprobe.runtime.settings_batch.generate_settings`: one forward per step for every setting
    whose cache decodes alike), the others one at a time (:func:`run_setting`).

    Parameters
    ----------
    runs
        ``(setting, resolved budget)`` pairs.
    prefill
        A :class:`~headprobe.runtime.shared_prefill.RecordedPrefill` of ``input_ids``, or ``None`` (every setting alone).
    stop_at_line
        End each answer at its first line break (the task scores only the first line).

    Returns
    -------
    list of SettingRun
        In the order of ``runs``; each answer, its bytes and new tokens are those of the setting run alone.
        A batched setting's ``seconds`` is the prompt forward, its cache's compression and its share of the
        batch's decode.
    """
    out: list[SettingRun | None] = [None] * len(runs)
    together = [i for i, (s, _) in enumerate(runs) if prefill is not None and shares_prefill(s)]
    if together:
        caches = [CacheSetting(runs[i][0].runtime_policy, budget=runs[i][1]) for i in together]   # built once
        made = generate_settings(lm, prefill, caches, max_new_tokens=max_new_tokens, stop_at_line=stop_at_line)
        for i, gen in zip(together, made, strict=True):
            out[i] = _measured(lm, gen.result, gen.seconds + prefill.seconds, True, gen.batch_settings)
            if gen.twin is not None:         # keeps exactly what an earlier setting keeps: generated once
                out[i] = replace(out[i], same_cache_as=runs[together[gen.twin]][0].label)
    for i, (setting, budget) in enumerate(runs):
        if out[i] is None:
            out[i] = run_setting(lm, input_ids, setting, budget, max_new_tokens, question_span=question_span,
                                 stop_at_line=stop_at_line)
    return out


def _measured(lm: LoadedModel, res: Any, seconds: float, shared_prefill: bool, batch_settings: int = 1) -> SettingRun:
    """The :class:`SettingRun` of a generation result (its first row)."""
    tok = lm.tokenizer
    return SettingRun(text=res.texts[0],
                      new_tokens=count_new_tokens(res.new_tokens[0].tolist(), tok.eos_token_id, tok.pad_token_id),
                      cache_bytes=int(res.cache.memory_bytes()), used_bytes=int(res.cache.used_bytes()),
                      full_cache_bytes=int(res.cache.full_cache_bytes()), seconds=seconds,
                      shared_prefill=shared_prefill, batch_settings=batch_settings)


def run_setting(lm: LoadedModel, input_ids: list[int], setting: EvalSetting, budget: Any, max_new_tokens: int,
                prefill: Any = None, question_span: tuple[int, int] | None = None,
                stop_at_line: bool = False) -> SettingRun:
    """Generate an answer to one prompt under ``setting`` with its compressed cache, greedily, and measure it.

    Parameters
    ----------
    lm
        A :class:`~headprobe.LoadedModel`.
    input_ids
        ``[prompt_len]`` token ids of the prompt.
    setting, budget
        The setting and its resolved budget (:func:`headprobe.eval.runner.resolve_budget`).
    prefill
        A :class:`~headprobe.runtime.shared_prefill.RecordedPrefill` of this prompt: the prompt forward is not run again,
        and the time reported still includes it, as if this setting had run alone.
    question_span
        For a kvpress setting (``kvpress:PRESS``): ``(start, end)`` token positions of the prompt's question;
        the tokens before it are the context kvpress compresses (:func:`run_kvpress_setting`).
    stop_at_line
        End the answer at its first line break (not for kvpress's pipeline, which runs its own loop).
    """
    if setting.policy == KVPRESS:
        return run_kvpress_setting(lm, input_ids, setting, max_new_tokens, question_span)
    policy = setting.runtime_policy           # built once per setting (and window), not per trial
    start = time.perf_counter()
    if prefill is None:
        res = generate_compressed(lm, input_ids=torch.tensor([input_ids]), policy=policy, budget=budget,
                                  max_new_tokens=max_new_tokens, stop_at_line=stop_at_line)
        seconds = time.perf_counter() - start
    else:
        res = generate_from_prefill(lm, prefill, policy=policy, budget=budget, max_new_tokens=max_new_tokens,
                                    stop_at_line=stop_at_line)
        seconds = time.perf_counter() - start + prefill.seconds
    return _measured(lm, res, seconds, prefill is not None)


def run_kvpress_setting(lm: LoadedModel, input_ids: list[int], setting: EvalSetting, max_new_tokens: int,
                        question_span: tuple[int, int] | None) -> SettingRun:
    """One answer of a ``kvpress:PRESS`` setting, by kvpress's own pipeline
    (:func:`headprobe.library_bridges.press_settings.run_press`), measured as :func:`run_setting` measures.

    kvpress's context is the prompt up to the question, its question the rest; with the setting option
    ``compress_questions=true`` (kvpress's evaluation flag of that name) the question is part of the
    context and only what follows it (the chat template's end, the answer prefix) is kept whole.

    Raises
    ------
    HeadprobeError
        No ``context_len`` (the task does not say where its question starts), kvpress missing.
    """
    if question_span is None:
        raise HeadprobeError(f"setting {setting.label}: kvpress settings need to know where the prompt's question "
                             "starts; this task does not say")
    context_len = question_span[1] if setting.options.get("compress_questions") else question_span[0]
    run = run_press(lm, input_ids, context_len, setting.profiles[0], setting.options, setting.capacity,
                    max_new_tokens, setting.name)
    tok = lm.tokenizer
    return SettingRun(text=run.text, new_tokens=count_new_tokens(run.generated, tok.eos_token_id, tok.pad_token_id),
                      cache_bytes=run.cache_bytes, used_bytes=run.cache_bytes, full_cache_bytes=run.full_cache_bytes,
                      seconds=run.seconds,
                      press={"compression_ratio": run.compression_ratio, "attended_tokens": run.attended_tokens})
