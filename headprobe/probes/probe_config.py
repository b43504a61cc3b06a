"""The settings of a needle probe run, shared by the fast, reference and reuse modes, and the head scores it
records (:class:`NeedleScores`, a needle pass's score names)."""

from __future__ import annotations

from dataclasses import dataclass

from .modes import DEFAULT_RECOMPUTE_SHARE


@dataclass(frozen=True)
class NeedleScores:
    """The head scores a needle pass records per trial, by name (each name a profile kind of the pass).

    Attributes
    ----------
    weight
        The attention-weight score (HeadKV-ER for retrieval needles, HeadKV-R2 for reasoning needles,
        :func:`~headprobe.probes.head_scores.reasoning_scores`).
    copy
        The copy score (Wu et al., :func:`~headprobe.probes.head_scores.copy_scores`), or ``None`` for a
        pass that does not record it.
    """

    weight: str
    copy: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every score name, the copy score first."""
        return (self.copy, self.weight) if self.copy else (self.weight,)


@dataclass
class NeedleProbeConfig:
    """Settings of a needle probe run.

    Attributes
    ----------
    scores
        The head scores the trials record (the needle pass's, :class:`NeedleScores`).
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

    scores: NeedleScores
    mode: str = "fast"
    chat_template: bool = True
    batch_size: int = 4
    max_new_tokens: int = 24
    gate: str = "published"
    split_attention: bool = True
    recompute_share: float = DEFAULT_RECOMPUTE_SHARE
