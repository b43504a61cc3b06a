"""KeepKV's merge of evicted pairs into retained ones (electoral votes, ZIP / convex / values-only).

A pair ``i`` carries votes ``p_i`` and an estimated logit ``l_i = ln s_i`` (``s_i = exp(q·k_i·scale)``).
Merging a set ``M`` (the retained pair ``c`` and the evicted pairs assigned to it) gives
``p_r = Σ p_i``, ``v_r = Σ w_i v_i / Σ w_i`` with ``w_i = p_i s_i``, and keys:

- ``zip``: ``k_r = (Σ w_i k_i) · ln(Σ w_i / Σ p_i) / Σ w_i l_i`` (the paper's equation 7 for any number
  of pairs), so that ``p_r · exp(q·k_r·scale) = Σ w_i`` whenever ``l_i`` are the true logits of ``q``:
  the attention output of that query is unchanged;
- ``convex``: ``k_r = Σ w_i k_i / Σ w_i`` (the released code);
- ``values_only``: ``k_r = k_c``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KEY_MERGES = ("zip", "convex", "values_only")


def merge_groups(keys: torch.Tensor, values: torch.Tensor, log_votes: torch.Tensor, logits: torch.Tensor,
                 target: torch.Tensor, merged: torch.Tensor, key_merge: str = "zip"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge pairs into their targets, per segment.

    Parameters
    ----------
    keys, values
        ``[segments, L, head_dim]``.
    log_votes, logits
        ``[segments, L]`` ``ln p`` and estimated ``ln s``.
    target
        ``[segments, L]`` index (in ``0..L-1``) of the pair each pair merges into; a retained pair
        targets itself.
    merged
        ``[segments, L]`` bool: pairs that take part (evicted pairs being merged and every retained pair).

    Returns
    -------
    keys, values, log_votes, logits
        Updated tensors; only the rows of retained pairs are meaningful.
    """
    s, length = keys.shape[:2]
    ft = torch.float64 if keys.dtype == torch.float64 else torch.float32
    shift = logits.masked_fill(~merged, float("-inf")).amax(1, keepdim=True).clamp(min=-1e30)
    p = torch.exp(log_votes.to(ft)) * merged
    w = p * torch.exp((logits.to(ft) - shift).clamp(max=0))          # scaled by exp(-shift)
    w = w * merged
    idx = target.clamp(0, length - 1)

    def gather_sum(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((s, length, *x.shape[2:]), dtype=ft, device=keys.device)
        index = idx if x.dim() == 2 else idx[..., None].expand_as(x)
        return out.scatter_add_(1, index, x.to(ft))

    sw, sp = gather_sum(w), gather_sum(p)
    swk, swv = gather_sum(w[..., None] * keys.to(ft)), gather_sum(w[..., None] * values.to(ft))
    swl = gather_sum(w * logits.to(ft))
    has = sw > 0
    new_v = torch.where(has[..., None], swv / sw.clamp(min=1e-30)[..., None], values.to(ft))
    new_lnp = torch.where(sp > 0, torch.log(sp.clamp(min=1e-30)), log_votes.to(ft))
    ln_ratio = torch.log(sw.clamp(min=1e-30)) + shift - torch.log(sp.clamp(min=1e-30))   # ln(Σw/Σp), true scale
    new_l = torch.where(has, ln_ratio, logits.to(ft))
    if key_merge == "zip":
        den = swl
        ok = has & (den.abs() > 1e-12)
        zip_k = swk * (ln_ratio / torch.where(ok, den, torch.ones_like(den)))[..., None]
        convex = swk / sw.clamp(min=1e-30)[..., None]
        new_k = torch.where(ok[..., None], zip_k, torch.where(has[..., None], convex, keys.to(ft)))
    elif key_merge == "convex":
        new_k = torch.where(has[..., None], swk / sw.clamp(min=1e-30)[..., None], keys.to(ft))
    elif key_merge == "values_only":
        new_k = keys.to(ft)
    else:
        raise ValueError(f"key_merge {key_merge!r}")
    return new_k.to(keys.dtype), new_v.to(values.dtype), new_lnp, new_l


def most_similar(keys: torch.Tensor, candidates: torch.Tensor, candidate_valid: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """For every key, the most cosine-similar candidate.

    Parameters
    ----------
    keys
        ``[segments, n, head_dim]``.
    candidates
        ``[segments, k, head_dim]`` retained keys; ``candidate_valid`` ``[segments, k]``.

    Returns
    -------
    similarity, index
        ``[segments, n]`` best cosine and its candidate index.
    """
    cos = torch.bmm(F.normalize(keys.float(), dim=-1), F.normalize(candidates.float(), dim=-1).transpose(1, 2))
    cos = cos.masked_fill(~candidate_valid[:, None, :], float("-inf"))
    return cos.max(-1)
