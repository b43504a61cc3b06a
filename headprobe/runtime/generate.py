"""One call: tokenize, build a :class:`CompressedCache`, run ``model.generate`` with it, report memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import StoppingCriteriaList

from ..budget_map import BudgetMap
from ..errors import HeadprobeError, param
from ..layer_split import LayerSplit
from ..limits import check_count
from ..models.cache_argument import with_cache
from ..models.loading import generation_eos_ids, transformers_model
from ..models.placement import input_device
from .answer_stop import AnswerStop
from .budget_sources import BudgetSource, MapBudget, RatioBudget, UniformBudget
from .cache import CompressedCache, headprobe_attention
from .policies import POLICIES, Policy, SlidingWindow
from .shape import CacheShape
from .split_budget import SplitBudget, is_split_map, load_budget_file

if TYPE_CHECKING:
    from ..models.loading import ModelLike

#: The policy when none is named.
DEFAULT_POLICY = "snapkv"
#: Tokens per head when no budget, capacity or ratio is given.
DEFAULT_CAPACITY = 128
#: The policy of sliding-window layers (Gemma 3's local layers), whatever the policy of the others.
SLIDING_POLICY: type[Policy] = SlidingWindow


@dataclass
class GenerationResult:
    """What :func:`generate_compressed` produced.

    Attributes
    ----------
    sequences
        ``[batch, prompt_len + new]`` token ids (prompt left-padded).
    new_tokens
        ``[batch, new]`` generated ids.
    texts
        Decoded answers (empty strings without a tokenizer).
    cache
        The cache after generation (``memory_bytes()``, ``kept_tokens()``).
    """

    sequences: torch.Tensor
    new_tokens: torch.Tensor
    texts: list[str]
    cache: CompressedCache

    @property
    def memory_bytes(self) -> int:
        return self.cache.memory_bytes()

    @property
    def full_cache_bytes(self) -> int:
        return self.cache.full_cache_bytes()


def make_policy(policy: str | Policy, **options: Any) -> Policy:
    """A policy instance from its name and options (``make_policy("keydiff", block_size=128)``)."""
    if isinstance(policy, Policy):
        if options:
            raise HeadprobeError(f"policy {policy.name}: pass options either to the instance or here, not both")
        return policy
    if policy not in POLICIES:
        raise HeadprobeError(f"unknown policy {policy!r}; expected one of {', '.join(sorted(POLICIES))}")
    return POLICIES[policy].from_options(options)


def parse_policy_options(items: list[str], what: str | None = None) -> dict[str, Any]:
    """``["block_size=128", "anchor=raw"]`` → ``{"block_size": 128, "anchor": "raw"}`` (ints, floats,
    true/false, else strings); the policy itself checks names and values (:func:`make_policy`).

    ``what`` names the items in error messages (default: the ``option`` parameter).
    """
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            where = f"{what} {item}" if what is not None else param("option", item)
            raise HeadprobeError(f"{where}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            out[key] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def as_budget_source(budget: BudgetSource | BudgetMap | str | int | None, ratio: float | None,
                     identity: Any = None, capacity: int | None = None) -> BudgetSource:
    """Normalise the budget arguments of :func:`generate_compressed`."""
    if capacity is not None:
        check_count("capacity", capacity)
    if ratio is not None:
        if budget is not None:
            raise HeadprobeError(f"give {param('budget')} or {param('ratio')}, not both")
        return RatioBudget(ratio)
    if isinstance(budget, BudgetSource):
        return budget
    if isinstance(budget, (str,)) or hasattr(budget, "__fspath__"):
        budget = load_budget_file(budget)
    if is_split_map(budget) or isinstance(budget, LayerSplit):      # an engine's layer split: its windows as they are
        if capacity is not None:
            raise HeadprobeError(f"a layer split keeps its own windows; give no {param('capacity')}")
        return SplitBudget.from_map(budget, identity) if is_split_map(budget) else SplitBudget(budget, identity)
    if isinstance(budget, BudgetMap):
        return MapBudget(budget, capacity=capacity, identity=identity)
    if isinstance(budget, int) and not isinstance(budget, bool):
        return UniformBudget(check_count("capacity", budget))
    if budget is None:
        return UniformBudget(capacity or DEFAULT_CAPACITY)
    raise HeadprobeError(f"{param('budget')} {budget!r}: expected a budget file, a BudgetMap, a capacity or a ratio")


@torch.no_grad()
def generate_compressed(model: ModelLike, prompts: str | list[str] | None = None, *, tokenizer: Any = None,
                        input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                        policy: str | Policy = DEFAULT_POLICY, budget: BudgetSource | BudgetMap | str | int | None = None,
                        ratio: float | None = None, capacity: int | None = None, max_new_tokens: int = 64,
                        policy_options: dict[str, Any] | None = None, chat: bool = False,
                        stop_at_line: bool = False, **generate_kwargs: Any) -> GenerationResult:
    """Generate with a compressed per-KV-head cache.

    Parameters
    ----------
    model
        A :class:`~headprobe.models.loading.LoadedModel` or a transformers causal LM.
    prompts
        One prompt or a list (left-padded into a batch); or pass ``input_ids``/``attention_mask``.
    policy
        Policy name (``snapkv``, ``keydiff``, ``morphkv``, ``keepkv``, ``dynamickv``, ``streaming``,
        ``full``) or instance; ``policy_options`` are its dataclass fields.
    budget, ratio, capacity
        A budget file / :class:`BudgetMap` (rescaled to ``capacity`` when given), a uniform capacity, or a
        ratio of each prompt.
    chat
        Wrap each prompt in the tokenizer's chat template.
    stop_at_line
        End a row at its answer's first line break, besides end-of-sequence
        (:class:`~headprobe.runtime.answer_stop.AnswerStop`).
    generate_kwargs
        Passed to ``model.generate`` (greedy by default).

    Returns
    -------
    GenerationResult
    """
    check_count("max_new_tokens", max_new_tokens)
    hf_model, tokenizer, input_ids, attention_mask = prepare_inputs(model, prompts, tokenizer, input_ids,
                                                                    attention_mask, chat)
    kwargs = {"do_sample": False, "max_new_tokens": max_new_tokens, **generate_kwargs}
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    if stop_at_line:
        stop = AnswerStop(tokenizer, input_ids.shape[1], generation_eos_ids(hf_model, tokenizer), first_line=True)
        kwargs["stopping_criteria"] = StoppingCriteriaList([stop, *(kwargs.get("stopping_criteria") or [])])
    with headprobe_attention(hf_model):           # refuses a model the cache cannot run, first
        cache = new_cache(model, policy, budget, ratio, capacity, policy_options, max_new_tokens, attention_mask)
        out = hf_model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                **with_cache(hf_model, cache), **kwargs)
    cache.check_attended()
    return finish(tokenizer, out, input_ids.shape[1], cache)


def prepare_inputs(model: ModelLike, prompts: str | list[str] | None, tokenizer: Any, input_ids: torch.Tensor | None,
                   attention_mask: torch.Tensor | None, chat: bool) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """``(hf_model, tokenizer, input_ids, attention_mask)`` on the model's device, prompts left-padded."""
    tokenizer = tokenizer or getattr(model, "tokenizer", None)
    hf_model = transformers_model(model)
    device = input_device(hf_model)
    if input_ids is None:
        if tokenizer is None or prompts is None:
            raise HeadprobeError("pass prompts with a tokenizer, or input_ids")
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        if chat:
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                   add_generation_prompt=True) for t in texts]
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        try:
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not chat)
        finally:
            tokenizer.padding_side = side
        input_ids, attention_mask = enc["input_ids"], enc["attention_mask"]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    return hf_model, tokenizer, input_ids.to(device), attention_mask.to(device)


def new_cache(model: ModelLike, policy: str | Policy, budget: BudgetSource | BudgetMap | str | int | None,
              ratio: float | None, capacity: int | None, policy_options: dict[str, Any] | None,
              max_new_tokens: int, attention_mask: torch.Tensor) -> CompressedCache:
    """An empty :class:`CompressedCache` for ``model`` from the budget arguments of :func:`generate_compressed`.

    The defaults are decided here: :data:`DEFAULT_POLICY`, :data:`DEFAULT_CAPACITY` tokens per head, and
    :data:`SLIDING_POLICY` for sliding-window layers. Whether the model can run the cache at all is
    checked by :func:`~headprobe.runtime.cache.headprobe_attention`, inside which callers build it.
    """
    identity = getattr(model, "identity", None)
    shape = CacheShape.from_config(transformers_model(model).config)
    pol = make_policy(policy, **(policy_options or {}))
    if budget is None and capacity is not None and ratio is None:
        budget = capacity
        capacity = None
    source = as_budget_source(budget, ratio, identity, capacity)
    if isinstance(source, MapBudget):
        source.check(shape)
    return CompressedCache(shape, pol, source, max_new_tokens=max_new_tokens, attention_mask=attention_mask,
                           sliding_policy=pol if getattr(pol, "serves_sliding_layers", False) else SLIDING_POLICY())


def finish(tokenizer: Any, sequences: torch.Tensor, prompt_len: int, cache: CompressedCache) -> GenerationResult:
    """The :class:`GenerationResult` of ``sequences`` ``[batch, prompt_len + new]``."""
    new = sequences[:, prompt_len:]
    texts = tokenizer.batch_decode(new, skip_special_tokens=True) if tokenizer is not None else [""] * len(new)
    return GenerationResult(sequences=sequences, new_tokens=new, texts=texts, cache=cache)

