"""A needle trial on the haystack's KV: selective recompute after the needle (CacheBlend-style).

A trial prompt is the haystack prompt with a needle inserted and another question at the end. Its tokens
fall into three parts (:class:`ReusePlan`):

- the shared prefix before the needle: the same tokens at the same positions as in the haystack prompt,
  so its keys and values are the haystack's exactly;
- the haystack after the needle (the *reused* run): the haystack's tokens, moved ``shift`` positions
  later by the needle. Their cached keys are re-rotated for the shift
  (:mod:`headprobe.attention.rope_shift`), but their keys and values from layer 1 on are still those of a
  context without the needle;
- new tokens (the needle, the question, anything that does not line up): computed in every layer.

The trial's teacher-forced responses run in the same forward as *branches* after the prompt: each sees
the prompt and its own earlier tokens, never another response.

:func:`selective_trial_forward` runs the model layer by layer over the new tokens and a share of the reused
ones, as CacheBlend does for reused text chunks: the layers before ``select_layer`` run over every token
after the prefix; at ``select_layer`` the reused tokens' fresh keys and values (projections only) are
compared with the cached ones, and the ``share`` of tokens with the largest deviation join the new ones;
from there on the layers run over those tokens only, and every other reused token keeps its cached
(re-rotated) keys and values (at ``select_layer`` itself, their fresh ones). No cache outlives a layer:
each layer's key buffer is put together, attended to and dropped.
With ``share = 1`` every token is recomputed in every layer and the result is the exact prompt KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.rope_shift import decoder_of, layer_rotation, rotate_half, shift_cos_sin, shift_keys
from ..attention.selective import KeyLayout, SelectiveAttention
from ..errors import HeadprobeError, param
from ..models.cache_argument import with_cache

#: The layer at which reused tokens are ranked by KV deviation (layer 0's keys and values depend only on
#: the token and its position, so layer 1 is the first where the needle changes them).
SELECT_LAYER = 1
#: Fewest aligned tokens worth reusing; a shorter run is recomputed as new tokens.
_MIN_RUN = 8
#: Architectures whose layers this forward drives (rotate-half RoPE on the whole head, ``model.model.layers``).
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


@dataclass(frozen=True)
class ReusePlan:
    """How a trial prompt lines up with the cached haystack prompt.

    Attributes
    ----------
    prefix
        Positions ``[0, prefix)`` hold the haystack prompt's tokens at the same positions.
    reuse_start, reuse_end
        Trial positions ``[reuse_start, reuse_end)`` hold haystack tokens
        ``[reuse_start - shift, reuse_end - shift)`` (an empty run when equal).
    shift
        Positions the reused run moved by (the needle's length, give or take a boundary token).
    length
        Tokens of the trial prompt covered by the plan.
    """

    prefix: int
    reuse_start: int
    reuse_end: int
    shift: int
    length: int

    @property
    def reused(self) -> int:
        return self.reuse_end - self.reuse_start

    def new_positions(self) -> torch.Tensor:
        """``[n_new]`` positions after the prefix that are not in the reused run, ascending."""
        return torch.cat([torch.arange(self.prefix, self.reuse_start), torch.arange(self.reuse_end, self.length)])

    def reused_positions(self) -> torch.Tensor:
        return torch.arange(self.reuse_start, self.reuse_end)


def plan_reuse(base_ids: list[int], trial_ids: list[int], prefix: int, needle_end: int, length: int) -> ReusePlan:
    """Line up ``trial_ids[:length]`` with ``base_ids`` after the needle.

    The haystack after the needle starts within a few tokens of ``needle_end`` in the trial and of
    ``prefix`` in the base prompt (tokens can merge at the needle's edges); the longest run of equal tokens
    starting there is the reused run. It ends before the last position (whose rows are always computed).

    Parameters
    ----------
    base_ids
        The haystack prompt (no needle) whose KV is cached.
    trial_ids
        The trial prompt.
    prefix
        Tokens both prompts share at the start (``<=`` the needle's first token).
    needle_end
        First trial position after the needle.
    length
        Trial positions to cover (the whole prompt).
    """
    base = torch.tensor(base_ids)
    trial = torch.tensor(trial_ids[:length])
    length_reusable = length - 1                                   # the last prompt token is always computed
    best = (0, needle_end, prefix)
    for t0 in range(needle_end, min(needle_end + 4, length_reusable)):
        for b0 in range(max(0, prefix - 2), min(prefix + 6, len(base_ids))):
            n = min(length_reusable - t0, len(base_ids) - b0)
            if n <= best[0]:
                continue
            diff = (trial[t0:t0 + n] != base[b0:b0 + n]).nonzero()
            run = int(diff[0, 0]) if len(diff) else n
            if run > best[0]:
                best = (run, t0, b0)
    run, t0, b0 = best
    if run < _MIN_RUN:
        return ReusePlan(prefix, length, length, 0, length)
    return ReusePlan(prefix, t0, t0 + run, t0 - b0, length)


def check_reuse_model(model) -> None:
    """Refuse models whose layers :func:`selective_prefill` cannot drive, in one line."""
    arch = getattr(model.config, "model_type", "?")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise HeadprobeError(f"{param('mode', 'reuse')}: not supported for {arch} models "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}); use fast mode")
    if getattr(decoder_of(model).config, "attn_logit_softcapping", None):
        raise HeadprobeError(f"{param('mode', 'reuse')}: not supported for models with attention logit "
                             "soft-capping; use fast mode")
    for layer_idx in range(len(decoder_of(model).layers)):
        layer_rotation(model, layer_idx)


@dataclass(frozen=True)
class Branches:
    """Teacher-forced responses that run after the prompt in the same forward.

    Response ``v`` with tokens ``f`` feeds ``f[:-1]`` at positions ``n .. n + len(f) - 2`` (``n``: the
    prompt length); its step 0 is predicted by the last prompt token, step ``t`` by its token ``t - 1``.

    Attributes
    ----------
    forced
        Per response, its tokens (a response without tokens takes no step).
    """

    forced: list[list[int]]

    @property
    def size(self) -> int:
        """Branch tokens in the forward."""
        return sum(max(len(f) - 1, 0) for f in self.forced)

    def layout(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids, positions, branch)`` ``[size]`` each, responses one after the other."""
        ids, positions, branch = [], [], []
        for v, f in enumerate(self.forced):
            ids += f[:-1]
            positions += range(n, n + len(f) - 1)
            branch += [v] * (len(f) - 1)
        return (torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                torch.tensor(branch, dtype=torch.long))

    def step_rows(self, v: int) -> list[int]:
        """Rows (of the last prompt token, then every branch token) that predict response ``v``'s steps."""
        if not self.forced[v]:
            return []
        offset = 1 + sum(max(len(f) - 1, 0) for f in self.forced[:v])
        return [0] + list(range(offset, offset + len(self.forced[v]) - 1))


@dataclass
class _ScatterCache:
    """What a decoder layer sees as its cache: the layer's key and value buffer, into which the active
    tokens' fresh keys and values are written at their buffer indices."""

    keys: torch.Tensor
    values: torch.Tensor
    index: torch.Tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys[:, :, self.index] = key_states.to(self.keys.dtype)
        self.values[:, :, self.index] = value_states.to(self.values.dtype)
        return self.keys, self.values


def fresh_kv(layer, hidden: torch.Tensor, positions: torch.Tensor, rotation) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values ``layer`` computes from its input ``hidden`` ``[1, tokens, hidden]`` at
    ``positions`` ``[tokens]``, without running its attention: ``[1, kv_heads, tokens, head_dim]`` each.

    The layer's own modules: input norm, key and value projections, the key norm where the model has one
    (Gemma 3, Qwen 3), the rotary embedding of the layer (``rotation``).
    """
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    keys = attn.k_proj(x).view(shape).transpose(1, 2)
    values = attn.v_proj(x).view(shape).transpose(1, 2)
    if getattr(attn, "k_norm", None) is not None:
        keys = attn.k_norm(keys)
    cos, sin = rotation.cos_sin(positions[None], x)
    cos, sin = cos[:, None], sin[:, None]
    return keys * cos + rotate_half(keys) * sin, values


def kv_deviation(cached: tuple[torch.Tensor, torch.Tensor], fresh: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Per token, how far fresh keys and values are from the cached ones: ``[tokens]`` float32.

    ``sum ||k_fresh - k_cached||² / mean ||k||² + sum ||v_fresh - v_cached||² / mean ||v||²`` over the KV
    heads (``[1, kv_heads, tokens, head_dim]`` inputs), so keys and values weigh alike whatever their scale.
    """
    total = None
    for old, new in zip(cached, fresh, strict=True):
        old, new = old.float(), new.float()
        scale = new.pow(2).sum(-1).mean().clamp_min(1e-12)
        part = (new - old).pow(2).sum(-1).sum(1)[0] / scale
        total = part if total is None else total + part
    return total


def output_logprobs(model, hidden: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` of the model's next-token logits for final hidden states ``[1, rows, hidden]``
    (final norm, output head, final soft-capping where the model has it): ``[rows, vocab]`` float32."""
    decoder = decoder_of(model)
    logits = model.lm_head(decoder.norm(hidden))[0].float()
    cap = getattr(decoder.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return torch.log_softmax(logits, dim=-1)


@dataclass(frozen=True)
class _TrialKeys:
    """A trial's keys in every layer: its ``n`` prompt positions, then its ``size`` branch tokens (at
    ``branch_pos`` ``[size]``, of the responses ``branch_of`` ``[size]``)."""

    n: int
    size: int
    branch_pos: torch.Tensor
    branch_of: torch.Tensor

    def layout(self, prompt_active: torch.Tensor, row_callback) -> KeyLayout:
        """The attention layout of a layer that computes ``prompt_active`` and every branch token."""
        device = self.branch_pos.device
        key_positions = torch.cat([torch.arange(self.n, device=device), self.branch_pos])
        key_branches = torch.cat([torch.full((self.n,), -1, device=device), self.branch_of])
        active_pos = torch.cat([prompt_active, self.branch_pos])
        tail = int(prompt_active[0]) if len(prompt_active) == self.n - int(prompt_active[0]) else None
        return KeyLayout(key_positions, key_branches, active_pos,
                         torch.cat([torch.full_like(prompt_active, -1), self.branch_of]), self.n, tail, 1 + self.size,
                         row_callback)

    def run_layer(self, layer, rotation, hidden: torch.Tensor, prompt_active: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor) -> torch.Tensor:
        """``layer`` over ``hidden`` ``[1, active + size, hidden]`` (the prompt's active positions, then the
        branch tokens), their fresh keys and values scattered into the layer's buffers."""
        active_pos = torch.cat([prompt_active, self.branch_pos])
        index = torch.cat([prompt_active, self.n + torch.arange(self.size, device=prompt_active.device)])
        out = layer(hidden, attention_mask=None, position_embeddings=rotation.cos_sin(active_pos[None], hidden),
                    position_ids=active_pos[None], **with_cache(layer, _ScatterCache(keys, values, index)))
        return out[0] if isinstance(out, tuple) else out


def _layer_buffers(base, plan: ReusePlan, shifted: bool, rotation, size: int, dtype: torch.dtype,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's key and value buffers ``[1, kv_heads, size, head_dim]`` for a trial: the haystack prompt's
    cached prefix, and with ``shifted`` the reused run's cached keys (re-rotated for ``plan.shift``) and
    values; the layer writes the positions it computes."""
    keys = torch.empty(1, base.keys.shape[1], size, base.keys.shape[3], dtype=dtype, device=device)
    values = torch.empty_like(keys)
    keys[:, :, :plan.prefix] = base.keys[:, :, :plan.prefix]
    values[:, :, :plan.prefix] = base.values[:, :, :plan.prefix]
    if shifted:
        src = slice(plan.reuse_start - plan.shift, plan.reuse_end - plan.shift)
        cos, sin = shift_cos_sin(rotation, plan.shift, base.keys)
        keys[:, :, plan.reuse_start:plan.reuse_end] = shift_keys(base.keys[:, :, src], cos, sin)
        values[:, :, plan.reuse_start:plan.reuse_end] = base.values[:, :, src]
    return keys, values


def _select_recomputed(layer, hidden_prompt: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan: ReusePlan,
                       recomputed: int, new_pos: torch.Tensor, reused_pos: torch.Tensor, rotation) -> torch.Tensor:
    """At the select layer: write the reused tokens' fresh keys and values into the buffers and return the
    prompt positions computed from here on (``[active]``, ascending): the new tokens and the ``recomputed``
    reused tokens whose keys and values deviate most from the cached ones (:func:`kv_deviation`)."""
    fresh = fresh_kv(layer, hidden_prompt[:, reused_pos - plan.prefix], reused_pos, rotation)
    deviation = kv_deviation((keys[:, :, reused_pos], values[:, :, reused_pos]), fresh)
    keys[:, :, reused_pos], values[:, :, reused_pos] = fresh[0].to(keys.dtype), fresh[1].to(values.dtype)
    chosen = reused_pos[torch.topk(deviation, recomputed).indices] if recomputed else reused_pos[:0]
    return torch.sort(torch.cat([new_pos, chosen])).values


@torch.no_grad()
def selective_trial_forward(model, base_cache, trial_ids: list[int], plan: ReusePlan, share: float,
                            branches: Branches, row_callback, select_layer: int = SELECT_LAYER):
    """A trial's prompt and responses on the haystack's cache, recomputing ``share`` of the reused run.

    Parameters
    ----------
    model, base_cache
        The causal LM (of :data:`SUPPORTED_ARCHITECTURES`) and the :class:`~transformers.DynamicCache` of the
        haystack prompt, ``[1, kv_heads, base_len, head_dim]`` per layer, every position kept.
    trial_ids, plan
        The trial prompt's tokens (``plan.length`` of them); :func:`plan_reuse`'s plan.
    share, branches
        Share of the reused tokens recomputed from ``select_layer`` on, in ``[0, 1]``; the responses.
    row_callback
        ``callback(layer, rows, key_positions)``: every layer's softmax rows ``[1, query_heads, 1 +
        branches.size, keys]`` of the last prompt token and the branch tokens over the layer's keys (the
        prompt's ``n`` positions, then the branch tokens), with the keys' positions ``[keys]``.
    select_layer
        Layer at which reused tokens are ranked by :func:`kv_deviation` (:func:`fresh_kv` against the cached
        keys and values); the layers before it run over every token after the prefix, and it keeps every
        reused token's fresh keys and values. With ``share = 0`` no layer runs over the reused tokens.

    Returns
    -------
    logprobs, recomputed
        ``[1 + branches.size, vocab]`` float32 log-probabilities of the next token after the last prompt
        token and after each branch token; the number of reused tokens recomputed from ``select_layer`` on.
    """
    decoder = decoder_of(model)
    device = base_cache.layers[0].keys.device
    dtype = base_cache.layers[0].keys.dtype
    n = plan.length
    branch_ids, branch_pos, branch_of = (t.to(device) for t in branches.layout(n))
    trial = _TrialKeys(n, len(branch_ids), branch_pos, branch_of)
    new_pos = plan.new_positions().to(device)
    reused_pos = plan.reused_positions().to(device)
    # share 0: no layer runs over the reused tokens (layer 0's cached KV is exact: token and position only)
    reuse_all = plan.reused and share == 0.0
    prompt_active = new_pos if reuse_all else torch.arange(plan.prefix, n, device=device)
    hidden_prompt = decoder.embed_tokens(torch.tensor(trial_ids[:n], device=device)[prompt_active][None])
    hidden_branch = decoder.embed_tokens(branch_ids[None])
    recomputed = 0 if reuse_all else plan.reused
    with SelectiveAttention(model) as switch:
        for layer_idx, layer in enumerate(decoder.layers):
            rotation = layer_rotation(model, layer_idx)
            shifted = plan.reused and share < 1.0 and (reuse_all or layer_idx >= select_layer)
            keys, values = _layer_buffers(base_cache.layers[layer_idx], plan, shifted, rotation, n + trial.size,
                                          dtype, device)
            if layer_idx == select_layer and plan.reused and 0.0 < share < 1.0:
                recomputed = round(share * plan.reused)
                keep = _select_recomputed(layer, hidden_prompt, keys, values, plan, recomputed, new_pos, reused_pos,
                                          rotation)
                hidden_prompt = hidden_prompt[:, torch.searchsorted(prompt_active, keep)]
                prompt_active = keep
            switch.layout = trial.layout(prompt_active, row_callback)
            hidden = torch.cat([hidden_prompt, hidden_branch], dim=1)
            hidden = trial.run_layer(layer, rotation, hidden, prompt_active, keys, values)
            hidden_prompt, hidden_branch = hidden[:, :len(prompt_active)], hidden[:, len(prompt_active):]
    rows_hidden = torch.cat([hidden_prompt[:, -1:], hidden_branch], dim=1)
    return output_logprobs(model, rows_hidden), recomputed
