"""When an answer is complete, and greedy decoding after a recorded first token that stops there.

:class:`AnswerStop` is a transformers ``StoppingCriteria``: a batch row is done at an end-of-sequence token
or, with ``first_line``, once its answer holds a line break after some text (the plain prompt form scores
only the first line, so nothing after it can change a score). ``generate`` pads a done row from then on and
ends when every row is done, so ``max_new_tokens`` is a ceiling, not the cost. Rows can be grouped (the
settings of :func:`~headprobe.runtime.settings_batch.generate_settings`): when every row of a group is done
the criterion says so once (``on_finish``), and the stacked cache stops changing those rows.

:func:`decode_rest` is the decode loop both :func:`~headprobe.runtime.shared_prefill.generate_from_prefill`
and :func:`~headprobe.runtime.settings_batch.generate_settings` run: transformers' ``generate`` over a cache
that already holds the prompt, from the recorded first token on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from ..errors import HeadprobeError
from ..models.cache_argument import with_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def line_complete(text: str) -> bool:
    """Whether an answer's text holds a line break after something written (leading blank lines are not
    an answer yet); the first line is then all that the plain form scores."""
    return "\n" in text.lstrip()


class AnswerStop(StoppingCriteria):
    """Per batch row: done at an end-of-sequence token, or (``first_line``) at the end of the answer's first
    line; optionally per group of rows.

    Parameters
    ----------
    tokenizer
        Decodes the answer for ``first_line`` (may be ``None`` without it).
    answer_start
        Column of ``input_ids`` where the answer starts (the prompt's length).
    eos
        End-of-sequence token ids.
    first_line
        Also stop a row once its answer's first line is written.
    groups
        ``(first_row, rows)`` per group; ``on_finish(first_row, rows)`` is called once when all of a group's
        rows are done, and :attr:`finished` records the sequence length at that step.
    pause_after
        End the whole ``generate`` call once this many groups have finished (:attr:`paused` says so), so
        that the caller can go on without them; the rows not done are not marked done.
    """

    def __init__(self, tokenizer: Any, answer_start: int, eos: set[int], first_line: bool = False,
                 groups: list[tuple[int, int]] | None = None,
                 on_finish: Callable[[int, int], None] | None = None, pause_after: int | None = None) -> None:
        if first_line and tokenizer is None:
            raise HeadprobeError("stopping at the answer's first line needs the tokenizer")
        self.tokenizer, self.answer_start, self.eos = tokenizer, answer_start, set(eos)
        self.first_line, self.groups, self.on_finish = first_line, groups or [], on_finish
        self.pause_after = pause_after
        self.paused = False
        self.done: list[bool] | None = None
        #: group index -> sequence length (prompt and answer) when its rows were all done
        self.finished: dict[int, int] = {}
        self._breaks: dict[int, bool] = {}

    def row_done(self, row: torch.Tensor) -> bool:
        """Whether the answer in ``row`` ``[columns]`` (prompt included) is complete at its last token."""
        last = int(row[-1])
        if last in self.eos:
            return True
        if not self.first_line:
            return False
        if last not in self._breaks:                     # decode the answer only after a token with a line break
            self._breaks[last] = "\n" in self.tokenizer.decode([last])
        return self._breaks[last] and line_complete(self.tokenizer.decode(row[self.answer_start:]))

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:  # noqa: ARG002 (transformers' signature)
        if self.done is None:
            self.done = [False] * input_ids.shape[0]
        for r in range(input_ids.shape[0]):
            if not self.done[r]:
                self.done[r] = self.row_done(input_ids[r])
        for g, (first, rows) in enumerate(self.groups):
            if g not in self.finished and all(self.done[first:first + rows]):
                self.finished[g] = input_ids.shape[1]
                if self.on_finish is not None:
                    self.on_finish(first, rows)
        if self.pause_after is not None and len(self.finished) >= self.pause_after and not all(self.done):
            self.paused = True
            return torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


def decode_rest(hf_model: PreTrainedModel, tokenizer: Any, cache: Any, sequences: torch.Tensor, mask: torch.Tensor, new: int,
                generate_kwargs: dict[str, Any], stop: AnswerStop) -> torch.Tensor:
    """Greedy ``generate`` of up to ``new`` more tokens after the prompt and its recorded first token.

    Parameters
    ----------
    cache
        A :class:`~headprobe.runtime.cache.CompressedCache` holding the prompt.
    sequences
        ``[batch, prompt_len + k]`` the prompt and the first ``k >= 1`` tokens (the cache holds all but the
        last).
    mask
        ``[batch, prompt_len]`` the prompt's attention mask.
    stop
        The criterion (with ``answer_start = prompt_len``); rows whose last given token already ended the
        answer are padded after it, as generate pads a finished row.

    Returns
    -------
    torch.Tensor
        ``[batch, prompt_len + k + generated]``.
    """
    answered = sequences[:, mask.shape[1]:]
    kwargs = {"do_sample": False, "max_new_tokens": new, **generate_kwargs}
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    kwargs["stopping_criteria"] = StoppingCriteriaList([stop, *(kwargs.get("stopping_criteria") or [])])
    given = sequences.shape[1]
    first_done = torch.tensor([stop.row_done(row) for row in sequences], device=sequences.device)
    sequences = hf_model.generate(input_ids=sequences, attention_mask=torch.cat([mask, torch.ones_like(answered)], 1),
                                  **with_cache(hf_model, cache), **kwargs)
    pad = kwargs.get("pad_token_id")
    if bool(first_done.any()) and pad is not None:
        sequences[first_done, given:] = pad
    cache.check_attended()
    return sequences
