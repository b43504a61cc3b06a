"""``layer_split_random``: the layer split's baseline, the global layers drawn at random.

The same split as ``layer_split`` (the same engine rule, window, sink and target, hence the same number of
global layers and the same bytes), but which layers stay global is drawn uniformly at random among the layers
that may (the model's own sliding layers stay local), from ``--seed``. It reads no profile:

``headprobe allocate --method layer_split_random --seed 1 --window 256 --ratio 0.25 --prompt-len 2000``
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..models.identity import ModelIdentity
from .allocator import Allocator, Source
from .layer_split_choice import SPLIT_POLICY, choose_layer_split, split_budget_map
from .layer_split_methods import SplitOptions, split_target, split_targets
from .options import CapacityOptions, option, spelled


@dataclass(frozen=True)
class RandomSplitOptions(SplitOptions):
    """``layer_split_random``'s options: the engine, the number of global layers, the seed of the draw."""

    seed: int = option(0, "seed of the random draw of the global layers", filename="seed")

    def check(self) -> None:
        super().check()
        if self.seed < 0:
            raise HeadprobeError(f"{spelled('seed', self.seed)}: expected 0 or more")


def random_layer_scores(layers: int, seed: int) -> np.ndarray:
    """``[layers]`` a random order of the layers as scores (a permutation of ``0 .. layers-1``, by ``seed``):
    the ``G`` best of any candidates are a uniform draw of ``G`` of them."""
    return np.random.default_rng(seed).permutation(layers).astype(np.float64)


def run_random(model: ModelIdentity, sources: Sequence[Source], capacity: CapacityOptions,  # noqa: ARG001 (every allocator takes the same arguments)
               options: RandomSplitOptions) -> BudgetMap:
    split = choose_layer_split(model, random_layer_scores(model.num_layers, options.seed), engine=options.engine,
                               window=capacity.window, sink=capacity.sink,
                               target=split_target(model, capacity, options), source={"seed": options.seed})
    return split_budget_map(split, "layer_split_random", **split_targets(options), seed=options.seed)


ALLOCATOR = Allocator("layer_split_random", (),
                      "random layers global (same count as layer_split, --seed), the rest a sliding window",
                      RandomSplitOptions, run_random, policy=SPLIT_POLICY)

__all__: Sequence[str] = ("ALLOCATOR", "RandomSplitOptions", "random_layer_scores", "run_random")
