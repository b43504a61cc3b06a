"""One prompt forward, many caches: record a prefill once, then generate from it with any setting.

Every policy whose prefill is plain causal attention (``Policy.full_prefill``: all but KeyDiff's block-wise
prefill) computes the same prompt forward and differs only in what it keeps afterwards. Comparing many
settings on one prompt (``headprobe eval``) therefore needs the forward once: :func:`record_prefill` runs
it and keeps, per layer, the post-RoPE queries, keys and values and the next-token logits;
:func:`generate_from_prefill` builds a fresh :class:`CompressedCache` from that record
(``CompressedCache.compress_prompt``), takes the greedy first token from the recorded logits, and lets
transformers' ``generate`` decode the rest over the compressed cache. The result equals
:func:`~headprobe.runtime.generate.generate_compressed` with the same arguments token for token (a test
checks it); only greedy decoding without logits processors is supported, and other generation settings
are refused rather than silently changed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..errors import HeadprobeError, param
from ..models.cache_argument import with_cache
from ..models.loading import generation_eos_ids, transformers_model
from .answer_stop import AnswerStop, decode_rest
from .budget_sources import UniformBudget
from .cache import CompressedCache, CompressedLayer, headprobe_attention
from .generate import DEFAULT_POLICY, GenerationResult, finish, new_cache, prepare_inputs
from .policies.base import Policy
from .policies.full import Full
from .prefill_attention import prefill_attention
from .shape import CacheShape

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..models.loading import ModelLike

#: generation_config fields that would make the first token something other than the argmax.
_FIRST_TOKEN_CHANGERS = {"do_sample": False, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                         "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None,
                         "min_new_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
                         "sequence_bias": None, "num_beams": 1}


@dataclass
class RecordedLayer:
    """One layer's prompt forward.

    Attributes
    ----------
    layer_idx
        Layer index.
    query
        ``[batch, q_heads, n, head_dim]`` post-RoPE queries.
    keys, values
        ``[batch, kv_heads, n, head_dim]``.
    scaling, sliding_window, softcap
        As the model's attention passed them.
    position_ids
        ``[batch, n]`` the position ids the forward used (left padding inferred from them when no mask).
    memo
        What caches built from the record computed from this layer's tensors alone (SnapKV's window scores),
        for the next cache (:attr:`~headprobe.runtime.policies.LayerContext.memo`).
    """

    layer_idx: int
    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    scaling: float
    sliding_window: int | None
    softcap: float | None
    position_ids: torch.Tensor | None
    memo: dict[Any, Any] = field(default_factory=dict)


@dataclass
class RecordedPrefill:
    """A prompt forward kept for :func:`generate_from_prefill`.

    Attributes
    ----------
    input_ids, attention_mask
        ``[batch, n]`` the prompt (left-padded).
    layers
        One :class:`RecordedLayer` per layer, in order.
    next_logits
        ``[batch, vocab]`` logits of the token after the prompt.
    seconds
        Wall time of the forward.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    layers: list[RecordedLayer]
    next_logits: torch.Tensor
    seconds: float

    def nbytes(self) -> int:
        """Bytes held by the record (queries, keys, values)."""
        return sum(t.numel() * t.element_size() for r in self.layers for t in (r.query, r.keys, r.values))


class PrefillRecorder(CompressedCache):
    """A compressed cache that runs plain prefill attention and records each layer's tensors instead of
    running a policy (its layers stay empty: no policy, budget or decode room is ever used)."""

    def __init__(self, shape: CacheShape, attention_mask: torch.Tensor) -> None:
        super().__init__(shape, Full(), UniformBudget(1), max_new_tokens=0, attention_mask=attention_mask,
                         sliding_policy=Full())
        self.records: list[RecordedLayer] = []

    def attend(self, layer: CompressedLayer, query: torch.Tensor, scaling: float, sliding_window: int | None,
               softcap: float | None, position_ids: torch.Tensor | None) -> torch.Tensor:
        keys, values, positions, valid = self.take_call(layer, query, sliding_window, position_ids)
        self.records.append(RecordedLayer(layer.layer_idx, query, keys, values, scaling, sliding_window, softcap,
                                          position_ids))
        return prefill_attention(query, keys, values, positions, valid, scaling, sliding_window, softcap)


def check_greedy(hf_model: PreTrainedModel, generate_kwargs: dict[str, Any]) -> None:
    """Refuse generation settings under which the first token is not the argmax of the prompt's logits."""
    config = getattr(hf_model, "generation_config", None)
    for name, neutral in _FIRST_TOKEN_CHANGERS.items():
        value = generate_kwargs.get(name, getattr(config, name, neutral) if config is not None else neutral)
        if value is not None and value != neutral and not (name == "min_new_tokens" and value == 0):
            raise HeadprobeError(f"generate_from_prefill: {name}={value!r} changes the first token; only greedy "
                                 "decoding without logits processors replays a recorded prefill "
                                 "(use generate_compressed)")


@torch.no_grad()
def record_prefill(model: ModelLike, prompts: str | list[str] | None = None, *, tokenizer: Any = None,
                   input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                   chat: bool = False) -> RecordedPrefill:
    """Run the prompt forward once and keep what :func:`generate_from_prefill` needs.

    Parameters
    ----------
    model
        A :class:`~headprobe.models.loading.LoadedModel` or a transformers causal LM.
    prompts, tokenizer, input_ids, attention_mask, chat
        As for :func:`~headprobe.runtime.generate.generate_compressed`.

    Returns
    -------
    RecordedPrefill
        About ``layers × n × (q_heads + 2 · kv_heads) × head_dim`` values (≈ 1 GB for SmolLM2 at 8K
        tokens in float32).
    """
    hf_model, _, input_ids, attention_mask = prepare_inputs(model, prompts, tokenizer, input_ids,
                                                            attention_mask, chat)
    position_ids = attention_mask.long().cumsum(-1) - 1      # as generate computes them
    position_ids = position_ids.masked_fill(attention_mask == 0, 1)
    with headprobe_attention(hf_model):           # refuses a model the cache cannot run, first
        recorder = PrefillRecorder(CacheShape.from_config(hf_model.config), attention_mask)
        start = time.perf_counter()
        out = hf_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=True, logits_to_keep=1, **with_cache(hf_model, recorder))
    seconds = time.perf_counter() - start
    recorder.check_attended()
    return RecordedPrefill(input_ids=input_ids, attention_mask=attention_mask, layers=recorder.records,
                           next_logits=out.logits[:, -1].float(), seconds=seconds)


@torch.no_grad()
def generate_from_prefill(model: ModelLike, prefill: RecordedPrefill, *, tokenizer: Any = None,
                          policy: str | Policy = DEFAULT_POLICY, budget: Any = None, ratio: float | None = None,
                          capacity: int | None = None, max_new_tokens: int = 64,
                          policy_options: dict[str, Any] | None = None, stop_at_line: bool = False,
                          **generate_kwargs: Any) -> GenerationResult:
    """Generate from a recorded prefill with a fresh compressed cache (greedy).

    Parameters
    ----------
    model
        The model :func:`record_prefill` ran.
    prefill
        The record; it is not modified and can serve any number of calls.
    policy, budget, ratio, capacity, max_new_tokens, policy_options
        As for :func:`~headprobe.runtime.generate.generate_compressed`.
    stop_at_line
        Also end a row at its answer's first line break (:class:`~headprobe.runtime.answer_stop.AnswerStop`).

    Returns
    -------
    GenerationResult
        The same sequences :func:`generate_compressed` would return with these arguments.

    Raises
    ------
    HeadprobeError
        A policy whose prefill is not plain attention (KeyDiff), or sampling / logits processors.
    """
    hf_model, tokenizer = check_replay(model, tokenizer, max_new_tokens, generate_kwargs)
    ids, mask = prefill.input_ids, prefill.attention_mask
    with headprobe_attention(hf_model):           # refuses a model the cache cannot run, first
        cache = new_cache(model, policy, budget, ratio, capacity, policy_options, max_new_tokens, mask)
        cache.compress_prompt(prefill.layers)
        sequences = first_tokens(prefill)
        stop = AnswerStop(tokenizer, ids.shape[1], generation_eos_ids(hf_model, tokenizer), stop_at_line)
        if max_new_tokens > 1 and not all(stop.row_done(row) for row in sequences):
            sequences = decode_rest(hf_model, tokenizer, cache, sequences, mask, max_new_tokens - 1, generate_kwargs,
                                    stop)
    return finish(tokenizer, sequences, ids.shape[1], cache)


def check_replay(model: ModelLike, tokenizer: Any, max_new_tokens: int,
                 generate_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``(hf_model, tokenizer)`` of a replay, after refusing what a recorded prefill cannot serve (sampling,
    logits processors, no new token)."""
    hf_model = transformers_model(model)
    check_greedy(hf_model, generate_kwargs)
    if max_new_tokens < 1:
        raise HeadprobeError(f"generate_from_prefill: {param('max_new_tokens', max_new_tokens)}: expected at least 1")
    return hf_model, tokenizer or getattr(model, "tokenizer", None)


def first_tokens(prefill: RecordedPrefill) -> torch.Tensor:
    """``[batch, prompt_len + 1]``: the prompt and its greedy first token, from the recorded logits."""
    ids = prefill.input_ids
    first = prefill.next_logits.argmax(-1, keepdim=True).to(ids.device, ids.dtype)   # [batch, 1]
    return torch.cat([ids, first], 1)
