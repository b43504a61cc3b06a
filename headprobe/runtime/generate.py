"""One call: tokenize, build a :class:`CompressedCache`, run ``model.generate`` with it, report memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import text_config
from ..models.loading import transformers_model
from .budget_sources import BudgetSource, MapBudget, RatioBudget, UniformBudget
from .cache import CompressedCache
from .cache_attention import headprobe_attention
from .policies import POLICIES, Policy


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


def parse_policy_options(items: list[str], what: str = "--option") -> dict[str, Any]:
    """``["block_size=128", "anchor=raw"]`` → ``{"block_size": 128, "anchor": "raw"}`` (ints, floats,
    true/false, else strings); the policy itself checks names and values (:func:`make_policy`)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise HeadprobeError(f"{what} {item}: expected KEY=VALUE")
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
    if ratio is not None:
        if budget is not None:
            raise HeadprobeError("give a budget or a ratio, not both")
        return RatioBudget(ratio)
    if isinstance(budget, BudgetSource):
        return budget
    if isinstance(budget, (str,)) or hasattr(budget, "__fspath__"):
        budget = BudgetMap.load(budget)
    if isinstance(budget, BudgetMap):
        return MapBudget(budget, capacity=capacity, identity=identity)
    if isinstance(budget, int):
        return UniformBudget(budget)
    if budget is None:
        return UniformBudget(capacity or 128)
    raise HeadprobeError(f"budget {budget!r}: expected a budget file, a BudgetMap, a capacity or a ratio")


@torch.no_grad()
def generate_compressed(model: Any, prompts: str | list[str] | None = None, *, tokenizer: Any = None,
                        input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                        policy: str | Policy = "snapkv", budget: BudgetSource | BudgetMap | str | int | None = None,
                        ratio: float | None = None, capacity: int | None = None, max_new_tokens: int = 64,
                        policy_options: dict[str, Any] | None = None, chat: bool = False,
                        **generate_kwargs: Any) -> GenerationResult:
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
    generate_kwargs
        Passed to ``model.generate`` (greedy by default).

    Returns
    -------
    GenerationResult
    """
    hf_model, tokenizer, input_ids, attention_mask = prepare_inputs(model, prompts, tokenizer, input_ids,
                                                                    attention_mask, chat)
    cache = new_cache(model, policy, budget, ratio, capacity, policy_options, max_new_tokens, attention_mask)
    kwargs = {"do_sample": False, "max_new_tokens": max_new_tokens, **generate_kwargs}
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        kwargs.setdefault("pad_token_id", tokenizer.pad_token_id)
    with headprobe_attention(hf_model):
        out = hf_model.generate(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                                **kwargs)
    return finish(tokenizer, out, input_ids.shape[1], cache)


def prepare_inputs(model: Any, prompts: str | list[str] | None, tokenizer: Any, input_ids: torch.Tensor | None,
                   attention_mask: torch.Tensor | None, chat: bool) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """``(hf_model, tokenizer, input_ids, attention_mask)`` on the model's device, prompts left-padded."""
    tokenizer = tokenizer or getattr(model, "tokenizer", None)
    hf_model = transformers_model(model)
    device = next(hf_model.parameters()).device
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


def new_cache(model: Any, policy: str | Policy, budget: BudgetSource | BudgetMap | str | int | None,
              ratio: float | None, capacity: int | None, policy_options: dict[str, Any] | None,
              max_new_tokens: int, attention_mask: torch.Tensor) -> CompressedCache:
    """An empty :class:`CompressedCache` for ``model`` from the budget arguments of :func:`generate_compressed`."""
    identity = getattr(model, "identity", None)
    hf_model = transformers_model(model)
    pol = make_policy(policy, **(policy_options or {}))
    if budget is None and capacity is not None and ratio is None:
        budget = capacity
        capacity = None
    source = as_budget_source(budget, ratio, identity, capacity)
    if isinstance(source, MapBudget):
        source.check(*_shape(hf_model.config))
    return CompressedCache(hf_model.config, pol, source, max_new_tokens=max_new_tokens,
                           attention_mask=attention_mask)


def finish(tokenizer: Any, sequences: torch.Tensor, prompt_len: int, cache: CompressedCache) -> GenerationResult:
    """The :class:`GenerationResult` of ``sequences`` ``[batch, prompt_len + new]``."""
    new = sequences[:, prompt_len:]
    texts = tokenizer.batch_decode(new, skip_special_tokens=True) if tokenizer is not None else [""] * len(new)
    return GenerationResult(sequences=sequences, new_tokens=new, texts=texts, cache=cache)


def _shape(config: Any) -> tuple[int, int]:
    cfg = text_config(config)
    return int(cfg.num_hidden_layers), int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
