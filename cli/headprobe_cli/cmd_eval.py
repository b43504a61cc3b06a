"""``headprobe eval``: needle / reasoning-in-a-haystack grids and outside QA datasets under KV-cache settings."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from headprobe.errors import HeadprobeError
from headprobe.eval.babi import generate_questions
from headprobe.eval.cell_log import cell_log_path, check_eval_outputs
from headprobe.eval.items import items_from_babi, items_from_longgen, items_from_needles
from headprobe.eval.result import format_eval_summary
from headprobe.eval.settings import EVAL_PRESETS, expand_settings
from headprobe.haystack.corpus import load_haystack
from headprobe.haystack.needles import load_needles, shipped_needle_file
from headprobe.limits import check_count
from headprobe.probes import trial_grid

from .common_args import (
    TASK_FLAGS,
    add_loading_arguments,
    add_prompt_format_arguments,
    add_rerun_arguments,
    add_task_arguments,
    chat_template_wanted,
    check_task_flags,
    figure_path,
    load_model,
    output_figure,
    rank_note,
    rank_progress,
    resolve_prompt_format,
    unset,
)
from .progress import tqdm_progress
from .ruler_args import (
    add_ruler_arguments,
    add_save_samples_argument,
    check_ruler_flags,
    dataset_run,
    ruler_plan,
    ruler_summary,
)

if TYPE_CHECKING:
    from headprobe.distributed.ranks import Ranks

#: Library parameters whose flag is not ``--`` + the parameter name (errors name them by these flags).
FLAGS = {"spec": "--settings", "specs": "--settings", **TASK_FLAGS}
#: The tasks of ``--task``.
TASKS = ("needle", "babi", "dataset", "longgen", "ruler")


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Run a grid of context lengths x needle depths under each KV-cache setting "
        "(allocation, policy, capacity per head) and report accuracy per cell, mean accuracy, real "
        "cache bytes and time per token. Writes a result JSON (resumable cell by cell) and a PNG grid.\n\n"
        "Settings are presets (" + ", ".join(EVAL_PRESETS) + ") or "
        "POLICY[:ALLOCATION[:PROFILE,...]], PROFILE being a profile kind or file."
    )
    p.epilog = (
        "examples:\n"
        "  headprobe eval --settings full snapkv headkv-r2 combined --capacities 32 128 "
        "--lengths 1000 2000 --depths 0 50 100\n"
        "  headprobe eval --task babi --babi-count 8 --settings full snapkv --capacities 64\n"
        "  headprobe eval --task dataset --dataset qa.jsonl --fields context=context,question=input,"
        "answers=answers --settings full snapkv --capacities 128\n"
        "  headprobe eval --task ruler --ruler-tasks niah_single_1 --lengths 2048 --samples 20 "
        "--settings full snapkv --ratios 0.5 0.9\n"
        "  headprobe eval ... --out results/eval.json --resume      # continue an interrupted grid\n"
        "  torchrun --standalone --nproc-per-node 2 -m headprobe eval ...   # cell groups split over 2 ranks"
    )
    add_loading_arguments(p)
    p.add_argument("--settings", nargs="+", default=["full", "snapkv", "headkv-r2"], metavar="SETTING")
    p.add_argument("--capacities", nargs="+", type=int, default=unset([128]), help="mean tokens per KV head")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="policy option, repeatable")
    p.add_argument("--task", choices=list(TASKS), default="needle",
                   help="longgen: a long report on the haystack, scored by ROUGE-L against the full cache's report")
    add_task_arguments(p)
    add_ruler_arguments(p)
    add_save_samples_argument(p)
    p.add_argument("--seed", type=int, default=unset(0),
                   help="seed of the generated questions (--task babi, and ruler without --dataset)")
    p.add_argument("--max-new-tokens", type=int, default=unset(32),
                   help="tokens generated per answer (--task ruler: RULER's per task, capped by this when given)")
    add_prompt_format_arguments(p)
    p.add_argument("--no-shared-prefill", action="store_true",
                   help="run every setting's prompt forward separately (default: one forward per prompt serves "
                        "every setting whose policy prefills with plain attention; same answers)")
    p.add_argument("--out", default="eval/eval.json", help="result JSON (cell log beside it)")
    p.add_argument("--plot", default=None, help="PNG grid (default: beside --out); 'none' to skip")
    p.add_argument("--memory-plot", default=None,
                   help="also write accuracy vs cache bytes to this PNG ('none' or left out: no such figure)")
    add_rerun_arguments(p, log="its cell log", replaced="the cell log and the outputs")
    p.set_defaults(func=run)


def _lazy_progress(total: int, description: str):
    """A progress bar that appears with the first finished trial (not before a setting error)."""
    bar = []

    def advance(n: int) -> None:
        if not bar:
            bar.append(tqdm_progress(total, description))
        bar[0](n)

    return advance


def run(args: argparse.Namespace) -> int:
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.distributed.ranks import process_group

    with process_group(args.device) as ranks:     # one process unless started by torchrun
        return _eval(args, ranks)


def _eval(args: argparse.Namespace, ranks: Ranks) -> int:
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.distributed.eval_ranks import run_dataset_eval_on_ranks, run_eval_on_ranks
    from headprobe.eval.runner import EvalRequest

    settings, chat_template = _checked_settings(args)
    out, plot, memory_plot = _checked_outputs(args, ranks)
    figures = [f for f in (plot, memory_plot) if f is not None]
    # the figures there now are the ones this run may replace (check_eval_outputs allowed them); one that
    # another run writes meanwhile is refused when this run writes its own
    replaceable = {f for f in figures if args.force or f.exists()}
    _check_rank_log(args, ranks, out)
    depths = trial_grid.parse_depths(args.depths)
    items, examples, ruler, task = _task_inputs(args)
    haystack = load_haystack(args.haystack) if args.task not in ("dataset", "ruler") else None
    lm = load_model(args, ranks)
    resolve_prompt_format(args, lm.tokenizer)
    if examples is not None or ruler is not None:
        run = dataset_run(args, lm, ruler, examples, settings, main=ranks.is_main)
        progress = _lazy_progress(len(ranks.mine(run.examples)) * len(run.settings), "eval")
        result = run_dataset_eval_on_ranks(lm, run.examples, run.settings, out, ranks, run.max_length,
                                           run.max_new_tokens, run.name,
                                           chat_template, args.resume, args.force,
                                           rank_progress(ranks, progress), figures=figures,
                                           share_prefill=not args.no_shared_prefill,
                                           answer_task=run.answer_task)
    else:
        task["haystack"] = haystack.name
        task["haystack_fingerprint"] = haystack.fingerprint
        request = EvalRequest(settings, items, list(args.lengths), depths, haystack, task,
                              args.max_new_tokens, chat_template,
                              share_prefill=not args.no_shared_prefill)
        groups = ranks.mine(range(len(args.lengths) * len(depths)))     # the (length, depth) groups run here
        progress = _lazy_progress(len(items) * len(settings) * len(groups), "eval")
        result = run_eval_on_ranks(lm, request, out, ranks, resume=args.resume, force=args.force,
                                   progress=rank_progress(ranks, progress), figures=figures)
    if not ranks.is_main:
        rank_note(ranks, f"{len(result.cells)} cells; wrote {ranks.part_path(out)}")
        return 0
    _print_and_plot(args, result, out, ruler, plot, memory_plot, replaceable)
    return 0


def _checked_settings(args: argparse.Namespace) -> tuple[list, bool]:
    """The settings of ``--settings`` x ``--capacities``, each policy's options checked, and the
    chat-template switch, after the flags of other tasks are refused: every mistake in the command line
    fails before the model loads."""
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.runtime.generate import parse_policy_options
    from headprobe.runtime.policies import POLICIES

    check_ruler_flags(args)     # before check_task_flags forgets which flags were typed
    check_task_flags(args, TASKS)       # a flag of another task would be ignored
    settings = expand_settings(args.settings, args.capacities, parse_policy_options(args.option),
                               tuple(POLICIES))
    check_count("max_new_tokens", args.max_new_tokens)
    chat_template = chat_template_wanted(args)
    for s in settings:   # bad policy options fail before the model loads
        s.check_policy()
        if s.is_kvpress and args.task == "dataset":
            raise HeadprobeError(f"setting {s.label}: kvpress settings run where the prompt's question is known "
                                 "(--task ruler, needle, babi, longgen); --task dataset does not mark it")
    return settings, chat_template


def _checked_outputs(args: argparse.Namespace, ranks: Ranks) -> tuple[Path, Path | None, Path | None]:
    """The result JSON, the grid figure and the memory figure (``None``: not written), checked on the main
    rank before the model loads; the merged outputs are rank 0's, each rank checks its own log later."""
    out = Path(args.out)
    plot = output_figure(args.plot, out)
    memory_plot = figure_path(args.memory_plot) if (args.memory_plot or "none").lower() != "none" else None
    if ranks.is_main:
        check_eval_outputs(out, [f for f in (plot, memory_plot) if f is not None], resume=args.resume,
                           force=args.force)
    return out, plot, memory_plot


def _check_rank_log(args: argparse.Namespace, ranks: Ranks, out: Path) -> None:
    """Under torchrun each rank keeps its own cell log: refuse one left by an earlier run unless
    ``--resume`` or ``--force`` says what to do with it."""
    part_log = cell_log_path(ranks.part_path(out))
    if ranks.distributed and part_log.exists() and not (args.resume or args.force):
        raise HeadprobeError(f"{part_log}: a cell log already exists; pass --resume to continue it or --force to "
                             "start over")


def _task_inputs(args: argparse.Namespace) -> tuple[list | None, list | None, object, dict | None]:
    """What ``--task`` runs on: ``(items, examples, ruler, task)``.

    Returns
    -------
    items, examples, ruler, task
        The grid's items and the task block of its result (needle, longgen, babi); the outside examples
        (dataset); the RULER plan (ruler). What a task does not use is ``None``.
    """
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.eval.datasets import load_qa_dataset

    items, examples, ruler, task = None, None, None, None
    if args.task == "ruler":
        ruler = ruler_plan(args)
    elif args.task == "dataset":
        if not args.dataset:
            raise HeadprobeError("--task dataset needs --dataset FILE_OR_NAME")
        examples = load_qa_dataset(args.dataset, args.split, limit=args.limit, fields=args.fields)
    elif args.task == "babi":
        items = items_from_babi(generate_questions(args.babi_count, args.babi_tasks, args.seed))
        task = {"kind": "babi", "count": args.babi_count, "tasks": list(args.babi_tasks), "seed": args.seed}
    else:
        path = args.needles or str(shipped_needle_file("retrieval"))
        needles = load_needles(path, args.needle_ids)
        items = items_from_longgen(needles) if args.task == "longgen" else items_from_needles(needles)
        task = {"kind": args.task, "needles": path, "needle_ids": [n.id for n in needles]}
    return items, examples, ruler, task


def _print_and_plot(args: argparse.Namespace, result, out: Path, ruler, plot: Path | None,
                    memory_plot: Path | None, replaceable: set[Path]) -> None:
    """The main rank's summary and figures (replacing a figure was settled by check_eval_outputs; the
    result lists them)."""
    print(format_eval_summary(result))
    if ruler is not None:
        print(ruler_summary(result, out))
    print(f"wrote {out}")
    if plot is not None or memory_plot is not None:
        _save_figures(args, result, plot, memory_plot, replaceable)


def _save_figures(args: argparse.Namespace, result, plot: Path | None, memory_plot: Path | None,
                  replaceable: set[Path]) -> None:
    """The task's figure (``--plot``) and accuracy against cache bytes (``--memory-plot``), each unless
    ``None``."""
    # loads matplotlib: imported when a figure is drawn, not for --help
    from headprobe.plots.eval_figures import accuracy_vs_memory, needle_grid, ruler_vs_memory
    from headprobe.plots.profile_figures import save_figure

    if plot is not None:
        fig = (ruler_vs_memory(result) if args.task == "ruler"
               else accuracy_vs_memory(result) if args.task == "dataset"
               else needle_grid(result))
        print(f"wrote {save_figure(fig, plot, force=plot in replaceable)}")
    if memory_plot is not None:
        fig = accuracy_vs_memory(result)
        print(f"wrote {save_figure(fig, memory_plot, force=memory_plot in replaceable)}")
