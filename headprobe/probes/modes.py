"""Profiling modes and reuse mode's recompute share: plain values the command line reads without loading torch."""

from __future__ import annotations

from ..errors import HeadprobeError, param

#: ``fast`` and ``reference`` give the exact scores; ``reuse`` approximates them (docs/profiling.md).
MODES = ("fast", "reference", "reuse")

#: The mode that picks one of :data:`MODES` once the model is loaded (:func:`auto_mode`): the command
#: line's default.
AUTO_MODE = "auto"

#: The share ``auto`` runs reuse mode at on a CPU: the default run measured within Spearman 0.96 and 9 of
#: the top 10 heads of the exact profile of a larger grid (docs/benchmarks.md, "The default profile").
AUTO_RECOMPUTE_SHARE = 0.0

#: Reuse mode's default share of the haystack after the needle recomputed per trial (chosen from the
#: agreement/speed curve in docs/benchmarks.md).
DEFAULT_RECOMPUTE_SHARE = 0.1


def parse_recompute_share(percent: float) -> float:
    """A recompute share given in percent (0-100) as a fraction in [0, 1]."""
    if not 0 <= percent <= 100:
        raise HeadprobeError(f"{param('recompute_share', percent)}: expected a percentage between 0 and 100")
    return percent / 100


def check_recompute_share(share: float) -> None:
    """Refuse a share outside [0, 1]."""
    if not 0.0 <= share <= 1.0:
        raise HeadprobeError(f"{param('recompute_share', share)}: expected a share between 0 and 1")


def auto_mode(on_cpu: bool, runs_reuse: bool, asked_fast: bool, asked_share: bool) -> str:
    """The mode ``auto`` stands for: reuse mode on a CPU (where exact profiling of long prompts takes
    minutes per probe) when every requested pass runs in it and the model's architecture is one reuse
    mode drives, else fast mode (exact; on a GPU it is fast already).

    Parameters
    ----------
    runs_reuse
        Every requested pass runs in reuse mode, and the model is one it drives.
    asked_fast, asked_share
        A fast-mode parameter (``batch_size``, ``split_attention``) or a recompute share was set: that
        mode is meant.
    """
    if asked_fast or not runs_reuse:
        return "fast"
    return "reuse" if on_cpu or asked_share else "fast"
