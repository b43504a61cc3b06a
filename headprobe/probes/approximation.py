"""What an approximate profile says of itself: the approximation that made it, and how far that
approximation was measured to be from the exact profile, where it was measured.

A reuse-mode profile records ``probe.approximation``: the method, and either the measured agreement of the
same command with the exact fast-mode profile of a larger grid (model, grid, share and kind as measured
in docs/benchmarks.md, "The default profile"), or a statement that it was not measured for this run's
model, grid or share. Nothing is claimed for what was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .aggregate import steps_of_log
from .trial_grid import CPU_DEPTHS, CPU_LENGTHS


@dataclass(frozen=True)
class Agreement:
    """A measured distance from exact: Spearman over all query heads, top-10 and top-20 overlap, gate flips.

    Attributes
    ----------
    against
        The exact profile it was compared with.
    """

    spearman: float
    top10: int
    top20: int
    gate_flips: int
    trials: int
    against: str

    def to_json(self) -> dict[str, Any]:
        return {"spearman": self.spearman, "top10_overlap": self.top10, "top20_overlap": self.top20,
                "gate_flips": self.gate_flips, "trials": self.trials, "against": self.against}


_REFERENCE = ("fast mode (exact), lengths 1000 2000 4000 x depths 0 25 50 75 100, every shipped needle, "
              "likelihood gate")
_GEMMA_REFERENCE = "fast mode (exact), lengths 1000 2000 4000 x depths 0 50 100, every shipped needle, likelihood gate"

#: (model name, recompute share, lengths, depths) → {profile kind: agreement}: the measured approximations
#: (docs/benchmarks.md, "The default profile": ``benchmarks/bench_default_profile.py``).
MEASURED: dict[tuple[str, float, tuple[int, ...], tuple[float, ...]], dict[str, Agreement]] = {
    ("HuggingFaceTB/SmolLM2-135M-Instruct", 0.0, CPU_LENGTHS, CPU_DEPTHS): {
        "retrieval": Agreement(0.966, 9, 19, 2, 84, _REFERENCE),
        "enhanced_retrieval": Agreement(0.994, 9, 20, 2, 84, _REFERENCE),
        "retrieval_reasoning": Agreement(0.970, 10, 20, 2, 96, _REFERENCE),
    },
    ("google/gemma-3-270m", 0.0, CPU_LENGTHS, CPU_DEPTHS): {
        "retrieval": Agreement(0.973, 10, 19, 3, 84, _GEMMA_REFERENCE),
        "enhanced_retrieval": Agreement(0.992, 10, 20, 3, 84, _GEMMA_REFERENCE),
        "retrieval_reasoning": Agreement(0.968, 9, 20, 0, 96, _GEMMA_REFERENCE),
    },
}


def approximation_record(settings: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """``probe.approximation`` of a profile of ``kind`` from a log with these ``settings``; ``None`` for an
    exact mode (fast, reference) and for a pass that runs exactly in every mode (layer retention)."""
    if settings.get("mode") != "reuse":
        return None

    if not steps_of_log(settings).approximates_in_reuse:
        return None                         # the same exact runner under reuse mode's name
    share = float(settings.get("recompute_share", 0.0))
    record: dict[str, Any] = {"method": f"reuse mode, recompute share {100 * share:g}%"}
    model = (settings.get("model") or {}).get("name")
    key = (model, share, tuple(settings.get("lengths") or ()), tuple(float(d) for d in settings.get("depths") or ()))
    shipped = (bool((settings.get("needle_set") or {}).get("shipped"))
               and (settings.get("haystack") or {}).get("name") == "headprobe-corpus"
               and list(settings.get("seeds") or [0]) == [0])
    measured = MEASURED.get(key, {}).get(kind) if shipped else None        # type: ignore[arg-type]
    if measured is None:
        record["measured"] = None
        record["note"] = ("not measured for this model, grid and share; docs/benchmarks.md gives the "
                          "agreement measured elsewhere (bench_default_profile.py measures it)")
    else:
        record["measured"] = measured.to_json()
    return record
