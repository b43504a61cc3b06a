"""Data-parallel profiling, evaluation and ablation over the ranks of a ``torchrun`` launch.

Each rank runs a slice of the work and logs it in its own file; rank 0 gathers the slices over
torch.distributed and writes the outputs a single process writes. See ``docs/scale.md``.
"""

from .ablation_ranks import run_ablation_on_ranks
from .eval_ranks import run_dataset_eval_on_ranks, run_eval_on_ranks
from .profile_ranks import merge_pass, run_profile_on_ranks
from .ranks import DEFAULT_TIMEOUT, Ranks, backend_for, process_group, ranks_from_env

__all__ = ["DEFAULT_TIMEOUT", "Ranks", "backend_for", "merge_pass", "process_group", "ranks_from_env",
           "run_ablation_on_ranks", "run_dataset_eval_on_ranks", "run_eval_on_ranks", "run_profile_on_ranks"]
