"""The settings of a needle probe run, shared by the fast, reference and reuse modes."""

from __future__ import annotations

from dataclasses import dataclass

from .modes import DEFAULT_RECOMPUTE_SHARE


@dataclass
class NeedleProbeConfig:
    """Settings of a needle probe run.

    Attributes
    ----------
    mode
        ``"fast"``, ``"reference"`` or ``"reuse"``.
    chat_template
        Apply the model's chat template.
    batch_size
        Trials per forward in fast mode.
    max_new_tokens
        Reference mode, retrieval needles: decoding steps (stops earlier at end of sequence).
        Reasoning needles decode ``len(answer)`` tokens, as published.
    gate
        Reasoning needles: ``"published"`` (QA-F1 of the decoded answer; the decoded steps are scored) or
        ``"likelihood"`` (correct candidate more likely than the distractor; the steps that produce the
        correct candidate after the prompt are scored, in both modes).
    split_attention
        Fast mode: run the prompt forward's attention as an unmasked pass over the cached prefix plus a
        causal pass over the rest, merged by log-sum-exp (:mod:`headprobe.attention.prefix_split`; CPU,
        global-attention layers). ``False`` runs one masked SDPA call; the results agree to float rounding.
    recompute_share
        Reuse mode: share of the haystack after the needle recomputed in every layer (``1`` = exact).
    """

    mode: str = "fast"
    chat_template: bool = True
    batch_size: int = 4
    max_new_tokens: int = 24
    gate: str = "published"
    split_attention: bool = True
    recompute_share: float = DEFAULT_RECOMPUTE_SHARE
