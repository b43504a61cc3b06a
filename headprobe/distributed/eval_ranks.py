"""Eval grids and dataset evals over the ranks of a ``torchrun`` launch, merged at rank 0 into one result.

A needle / bAbI / long-generation grid is split by cell group: the (length, depth) groups of the grid,
length outer, are dealt round-robin, and each rank runs every setting and item of its groups (one shared
prompt forward per item still serves all settings). A dataset eval has one cell per setting, so it is
split by example: each rank answers every n-th example under every setting. Each rank keeps its own
result and cell log beside the merged one (``eval.shard{i}of{n}.json``,
``eval.shard{i}of{n}.cells.jsonl``) and resumes it with ``resume``. Rank 0 gathers the cells over the
process group and writes ``out``: the result a single process writes, cell by cell (answers, scores,
bytes; times are measured where each cell ran).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import HeadprobeError
from ..eval.cell_log import cell_id, cell_record
from ..eval.datasets import QAExample, run_dataset_eval
from ..eval.result import EvalResult
from ..eval.runner import EvalRequest, run_eval
from ..eval.settings import EvalSetting
from .ranks import Ranks

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


def run_eval_on_ranks(lm: LoadedModel, request: EvalRequest, out: str | Path, ranks: Ranks, resume: bool = False,
                      force: bool = False, progress: Callable[[int], None] | None = None,
                      figures: Sequence[str | Path] = ()) -> EvalResult:
    """:func:`~headprobe.eval.runner.run_eval` with the grid's cell groups split over ``ranks``.

    Returns
    -------
    EvalResult
        On rank 0 the merged result (also written to ``out``); on the others this rank's part.
    """
    if not ranks.distributed:
        return run_eval(lm, request, out, resume=resume, force=force, progress=progress, figures=figures)
    part = run_eval(lm, request, ranks.part_path(out), resume=resume, force=force, progress=progress,
                    shard=ranks.shard, figures=figures)
    shares = ranks.gather_json(part.cells)
    if shares is None:
        return part
    order = {cell_id(s, length, depth): k for k, (length, depth, s) in enumerate(
        (L, d, s) for L in request.lengths for d in request.depths for s in request.settings)}
    cells = sorted((c for share in shares for c in share), key=lambda c: order[c["trial"]])
    merged = _merged(part, cells, complete=len(cells) == len(order))
    merged.save(out, force=force)
    return merged


def run_dataset_eval_on_ranks(lm: LoadedModel, examples: list[QAExample], settings: list[EvalSetting], out: str | Path,
                              ranks: Ranks, max_length: int = 4000, max_new_tokens: int = 32,
                              dataset_name: str = "<dataset>", chat_template: bool = True, resume: bool = False,
                              force: bool = False, progress: Callable[[int], None] | None = None,
                              figures: Sequence[str | Path] = (), share_prefill: bool = True,
                              answer_task: Any = None, budgets: Mapping[str, Any] | None = None) -> EvalResult:
    """:func:`~headprobe.eval.datasets.run_dataset_eval` with the examples split over ``ranks``.

    Rank 0 puts each setting's trials back in the examples' order and recomputes its cell
    (:func:`~headprobe.eval.cell_log.cell_record`), as one process computes it over all examples.

    Raises
    ------
    HeadprobeError
        More ranks than examples.
    """
    if not ranks.distributed:
        return run_dataset_eval(lm, examples, settings, out, max_length, max_new_tokens, dataset_name,
                                chat_template, resume, force, progress, figures=figures, share_prefill=share_prefill,
                                answer_task=answer_task, budgets=budgets)
    if len(examples) < ranks.world_size:
        raise HeadprobeError(f"{len(examples)} examples for {ranks.world_size} ranks: give every rank one at least")
    part = run_dataset_eval(lm, ranks.mine(examples), settings, ranks.part_path(out), max_length, max_new_tokens,
                            dataset_name, chat_template, resume, force, progress, figures=figures,
                            share_prefill=share_prefill, answer_task=answer_task, budgets=budgets)
    shares = ranks.gather_json(part.cells)
    if shares is None:
        return part
    cells = []
    for setting in settings:
        cell = cell_id(setting, max_length, None)
        per_rank = [next(c["trials"] for c in share if c["trial"] == cell) for share in shares]
        # rank r answered examples r, r + n, r + 2n, ...: deal them back in that order
        trials = [per_rank[k % ranks.world_size][k // ranks.world_size] for k in range(len(examples))]
        cells.append(cell_record(setting, max_length, None, trials))
    merged = _merged(part, cells, complete=True)
    merged.task = {**part.task, "examples": len(examples)}
    merged.save(out, force=force)
    return merged


def _merged(part: EvalResult, cells: list[dict[str, Any]], complete: bool) -> EvalResult:
    """Rank 0's part with every rank's cells, without its shard mark."""
    extra = {k: v for k, v in part.extra.items() if k != "shard"}
    return EvalResult(model=part.model, task=dict(part.task), grid=part.grid, settings=part.settings, cells=cells,
                      complete=complete, created=part.created, headprobe_version=part.headprobe_version,
                      extra=extra)
