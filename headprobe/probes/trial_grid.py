"""The trial grid (needle × length × depth × seed), its default sizes, and sharding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..errors import HeadprobeError, param

T = TypeVar("T")

#: HeadKV's grid: 5 lengths up to 10K (capped at the model's context), 10 depths from 0 to 100%.
FULL_LENGTHS = (1000, 3250, 5500, 7750, 10000)
FULL_DEPTHS = tuple(i / 9 for i in range(10))
#: CPU default: finishes the embedded SmolLM2-135M, all probes, in under 10 minutes on 2 cores
#: (6.7 minutes measured; five depths took 10.4).
CPU_LENGTHS = (1000, 2000)
CPU_DEPTHS = (0.0, 0.5, 1.0)


@dataclass(frozen=True, order=True)
class TrialSpec:
    """One needle trial.

    Attributes
    ----------
    length
        Target prompt length in tokens.
    seed
        Haystack seed (document order).
    depth
        Needle depth in [0, 1].
    needle_id
        Which needle.
    """

    length: int
    seed: int
    depth: float
    needle_id: str

    @property
    def id(self) -> str:
        return f"{self.needle_id}|len={self.length}|depth={self.depth:.4f}|seed={self.seed}"

    @property
    def group(self) -> tuple[int, int, float]:
        """Trials of one group share a haystack prefix (same length, seed and depth)."""
        return (self.length, self.seed, self.depth)


def default_grid(on_gpu: bool, max_context: int | None) -> tuple[tuple[int, ...], tuple[float, ...], str]:
    """Lengths, depths and a description of the default grid for this machine and model."""
    if on_gpu:
        top = min(10000, max_context or 10000)
        lengths = FULL_LENGTHS if top >= 10000 else tuple(round(1000 + i * (top - 1000) / 4) for i in range(5))
        return lengths, FULL_DEPTHS, f"full grid (5 lengths up to {lengths[-1]}, 10 depths)"
    return CPU_LENGTHS, CPU_DEPTHS, f"CPU grid ({param('grid', 'full')} for HeadKV's)"


def full_grid(max_context: int | None) -> tuple[tuple[int, ...], tuple[float, ...], str]:
    return default_grid(True, max_context)


#: Default grids: ``auto`` is HeadKV's full grid on a GPU and the CPU grid elsewhere.
GRIDS = ("auto", "cpu", "full")


@dataclass(frozen=True)
class Grid:
    """The lengths and depths of a run's needle trials, as resolved for its model and device.

    Attributes
    ----------
    lengths
        Prompt lengths in tokens.
    depths
        Needle depths as fractions in [0, 1].
    description
        What they are, for the command's output (``"CPU grid (...)"``, ``"custom lengths, custom depths"``).
    default
        The default grid the run takes what it was not given from: ``"full"`` or ``"cpu"`` (other passes
        size themselves by it: layer retention's prompts per task).
    """

    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    description: str
    default: str = "cpu"


def resolve_grid(grid: str, lengths: Sequence[int] | None, depths: Sequence[float] | None, on_gpu: bool,
                 max_context: int | None) -> Grid:
    """The grid of a run: the lengths and depths given, the rest from ``grid`` on this device and model.

    Parameters
    ----------
    grid
        One of :data:`GRIDS`: ``full`` (HeadKV's, lengths capped at ``max_context``), ``cpu``, or ``auto``
        (full on a GPU, else cpu).
    lengths, depths
        Given values (``None``: the grid's).
    """
    if grid not in GRIDS:
        raise HeadprobeError(f"{param('grid', grid)}: expected one of {', '.join(GRIDS)}")
    full = grid == "full" or (grid == "auto" and on_gpu)
    grid_lengths, grid_depths, described = default_grid(full, max_context)
    if lengths is not None:
        described = "custom lengths"
    if depths is not None:
        described += ", custom depths"
    return Grid(tuple(grid_lengths if lengths is None else lengths), tuple(grid_depths if depths is None else depths),
                described, "full" if full else "cpu")


def make_grid(needle_ids: list[str], lengths: list[int], depths: list[float], seeds: list[int]) -> list[TrialSpec]:
    """All trials, in a fixed order (length, seed, depth, needle)."""
    return sorted(TrialSpec(l, s, d, n) for l in lengths for s in seeds for d in depths for n in needle_ids)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"i/n"`` → ``(i, n)`` with ``0 <= i < n``."""
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise HeadprobeError(f"{param('shard', text)}: expected i/n, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise HeadprobeError(f"{param('shard', text)}: expected 0 <= i < n")
    return i, n


def shard_trials(trials: list[TrialSpec], shard: tuple[int, int] | None) -> list[TrialSpec]:
    """This shard's trials: whole prefix groups are dealt round-robin so prefix reuse still works."""
    if shard is None:
        return trials
    i, n = shard
    groups = sorted({t.group for t in trials})
    mine = {g for k, g in enumerate(groups) if k % n == i}
    return [t for t in trials if t.group in mine]


def shard_samples(samples: list[T], shard: tuple[int, int] | None) -> list[T]:
    """This shard's layer-retention samples: every n-th one from position i (all of them without a shard)."""
    if shard is None:
        return samples
    i, n = shard
    return samples[i::n]


def parse_depths(percents: list[float]) -> list[float]:
    """Needle depths given in percent (0 = start of the haystack, 100 = its end) as fractions in [0, 1].

    One unit only: ``1`` is 1 %, not 100 %.
    """
    for v in percents:
        if not 0 <= v <= 100:
            raise HeadprobeError(f"{param('depths', v)}: expected a percentage between 0 and 100")
    return [v / 100 for v in percents]
