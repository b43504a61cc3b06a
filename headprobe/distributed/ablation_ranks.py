"""Head ablation over the ranks of a ``torchrun`` launch: the runs dealt round-robin, the result at rank 0.

The runs of an ablation (``baseline``, then ``top-k`` and ``random-k`` for each k) answer the same
prompts, so they cost about the same: rank i takes runs i, i + n, ... in that order and logs them in its
own run log beside the one a single process keeps (``ablation.runs.shard{i}of{n}.jsonl`` for
``ablation.runs.jsonl``), which ``resume`` continues. Rank 0 gathers the runs and builds the result one process builds from the same runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..eval.ablation import ablation_result, plan_ablation, run_ablation, run_masked
from .ranks import Ranks

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


def run_ablation_on_ranks(lm: LoadedModel, profile: Any, ks: list[int], items: list, lengths: list[int],
                          depths: list[float], haystack: Any, ranks: Ranks, seed: int = 0, max_new_tokens: int = 24,
                          chat_template: bool = True, progress: Callable[[int], None] | None = None,
                          log_path: str | Path | None = None, resume: bool = False,
                          force: bool = False) -> dict[str, Any] | None:
    """:func:`~headprobe.eval.ablation.run_ablation` with its runs split over ``ranks``.

    ``log_path`` names the run log of one process; each rank logs to its own beside it
    (:meth:`Ranks.part_path`).

    Returns
    -------
    dict or None
        The ablation result on rank 0, ``None`` on the others.
    """
    if not ranks.distributed:
        return run_ablation(lm, profile, ks, items, lengths, depths, haystack, seed, max_new_tokens, chat_template,
                            progress, log_path, resume, force)
    plan = plan_ablation(lm, profile, ks, items, lengths, depths, haystack, seed, max_new_tokens, chat_template)
    mine = ranks.mine(list(plan.runs))
    done = run_masked(lm, plan, mine, progress, ranks.part_path(log_path) if log_path is not None else None,
                      resume, force)
    shares = ranks.gather_json(done)
    if shares is None:
        return None
    return ablation_result(lm, plan, {run_id: run for share in shares for run_id, run in share.items()})
