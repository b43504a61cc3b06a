"""Profiling modes and reuse mode's recompute share: plain values the command line reads without loading torch."""

from __future__ import annotations

from ..errors import HeadprobeError, param

#: ``fast`` and ``reference`` give the exact scores; ``reuse`` approximates them (docs/profiling.md).
MODES = ("fast", "reference", "reuse")

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
