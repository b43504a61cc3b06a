"""``headprobe tune``: find the KV-cache setting that keeps the most accuracy at a memory, on held-out items."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from headprobe.errors import HeadprobeError
from headprobe.eval.ruler_generate import RulerGeneration, check_ruler_generation
from headprobe.haystack.corpus import load_haystack
from headprobe.haystack.needles import shipped_needle_file
from headprobe.limits import check_count
from headprobe.models.loading import model_identity
from headprobe.probes import trial_grid
from headprobe.tune.split import split_items

from .common_args import (
    TASK_FLAGS,
    add_loading_arguments,
    add_prompt_format_arguments,
    add_rerun_arguments,
    add_task_arguments,
    chat_template_wanted,
    check_task_flags,
    load_model,
    output_figure,
    rank_note,
    resolve_prompt_format,
)
from .progress import tqdm_progress
from .ruler_args import DEFAULT_TASKS as RULER_TASKS
from .ruler_args import add_ruler_arguments

if TYPE_CHECKING:
    from headprobe.distributed.ranks import Ranks
    from headprobe.tune.request import TuneTask

#: Library parameters whose flag is not ``--`` + the parameter name.
FLAGS = {"spec": "--presets", "specs": "--presets", **TASK_FLAGS}
#: The tasks of ``--task``.
TASKS = ("needle", "babi", "dataset", "ruler")


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Search, per capacity (tokens per KV head) or memory target, over the policies that take a "
        "budget map with the options that decide what a budget keeps (window, question window, pooling), "
        "then over the allocations (uniform, HeadKV per head-profile kind, PyramidKV, DynamicKV, "
        "combined) with their parameters: every candidate an eval setting, run on calibration items "
        "with successive halving and a bootstrap race dropping weak ones early. The chosen setting, "
        "every preset and the full cache are then evaluated on held-out items. Writes a report "
        "(JSON + figure), the chosen budget map per capacity and a setting string that eval and "
        "generate accept. See docs/tune.md."
    )
    p.epilog = (
        "examples:\n"
        "  headprobe tune --capacities 32 64 128 --lengths 1000 2000 4000 --depths 0 50 100\n"
        "  headprobe tune --cache-share 5% --context 4000 --holdout-ids r13 r14\n"
        "  headprobe tune --capacities 64 --policies snapkv --values window=32,question beta=1.01,1.2\n"
        "  headprobe tune ... --out tune/tune.json --resume      # continue an interrupted search\n"
        "  torchrun --standalone --nproc-per-node 2 -m headprobe tune ...   # eval runs split over 2 ranks"
    )
    add_loading_arguments(p)
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--capacities", nargs="+", type=int, default=None,
                        help="mean tokens per KV head to tune for (default 64)")
    memory.add_argument("--cache-share", default=None, metavar="SHARE",
                        help="a share of the full cache at --context, e.g. 5%% (the runtime's bytes)")
    memory.add_argument("--cache-bytes", default=None, metavar="SIZE", help="a cache size at --context, e.g. 2GiB")
    p.add_argument("--context", type=int, default=None, help="prompt tokens a memory target is for")
    p.add_argument("--task", choices=list(TASKS), default="needle")
    add_task_arguments(p)
    add_ruler_arguments(p)
    held = p.add_mutually_exclusive_group()
    held.add_argument("--holdout-ids", nargs="+", default=None, metavar="ID",
                      help="items the search never sees (default: a share of them, by a hash of their ids)")
    held.add_argument("--holdout-share", type=float, default=0.3, help="share of the items held out")
    p.add_argument("--policies", nargs="+", default=None, metavar="POLICY",
                   help="policies searched (default: those that take a budget and share the prompt forward)")
    p.add_argument("--allocations", nargs="+", default=None, metavar="METHOD",
                   help="allocations searched (default: every one)")
    p.add_argument("--head-kinds", nargs="+", default=None, metavar="KIND",
                   help="head-profile kinds HeadKV and combined read (default: every kind found for the model)")
    p.add_argument("--values", nargs="+", default=[], metavar="KEY=V1,V2",
                   help="values tried for a policy or allocation option, e.g. window=8,32,question beta=1.01,1.2")
    p.add_argument("--keep-selections", type=int, default=2,
                   help="selections (policy + options) carried from the first stage into the allocation stage")
    p.add_argument("--no-preset-candidates", action="store_true",
                   help="do not race the presets beside the generated candidates")
    p.add_argument("--presets", nargs="+", default=None, metavar="SETTING",
                   help="settings evaluated beside the chosen one on the held-out items (default: every preset)")
    p.add_argument("--max-candidates", type=int, default=300,
                   help="refuse a stage with more candidates per capacity than this")
    p.add_argument("--eta", type=int, default=3, help="successive halving's factor")
    p.add_argument("--level", type=float, default=0.9, help="coverage of the bootstrap intervals")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the bootstrap and bAbI questions")
    p.add_argument("--max-new-tokens", type=int, default=32)
    add_prompt_format_arguments(p)
    p.add_argument("--no-shared-prefill", action="store_true")
    p.add_argument("--out", default="tune/tune.json", help="report JSON (eval runs in <stem>.runs/ beside it)")
    p.add_argument("--plot", default=None, help="figure (default: beside --out); 'none' to skip")
    add_rerun_arguments(p, log="its eval runs' cell logs", replaced="the eval runs and the outputs")
    p.set_defaults(func=run)


def _ruler_task(args: argparse.Namespace) -> TuneTask:
    """RULER's samples to generate: calibration from ``--seed``, held out from ``--seed + 1``, checked before
    the model loads."""
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.tune.request import TuneTask

    for flag, given in (("--ratios", args.ratios is not None), ("--dataset", bool(args.dataset)),
                        ("--limit", args.limit is not None), ("--holdout-ids", bool(args.holdout_ids))):
        if given:
            raise HeadprobeError(f"{flag}: tune --task ruler generates its samples (calibration from --seed, held out "
                                 "from --seed + 1) at --capacities or --cache-share; leave it out")
    if not args.lengths:
        raise HeadprobeError("--lengths: give at least one")
    samples = 10 if args.samples is None else args.samples
    check_count("samples", samples)
    calibration = RulerGeneration(tuple(args.ruler_tasks or RULER_TASKS), tuple(args.lengths), samples,
                                  args.seed)
    holdout = RulerGeneration(calibration.tasks, calibration.lengths, samples, args.seed + 1)
    check_ruler_generation(calibration, model_identity(args.model, args.trust_remote_code).max_context)
    return TuneTask.ruler(calibration, holdout, args.max_new_tokens)   # RULER's tokens, capped


def _task(args: argparse.Namespace) -> TuneTask:
    """The task's items and grid (no model needed)."""
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.eval.datasets import load_qa_dataset
    from headprobe.tune.request import TuneTask

    if args.task == "ruler":
        return _ruler_task(args)
    if (args.ruler_tasks is not None or args.samples is not None or args.ratios is not None):
        flag = next(f for f, v in (("--ruler-tasks", args.ruler_tasks), ("--samples", args.samples),
                                   ("--ratios", args.ratios)) if v is not None)
        raise HeadprobeError(f"{flag}: applies to tune --task ruler only, not --task {args.task}")
    if args.task == "dataset":
        if not args.dataset:
            raise HeadprobeError("--task dataset needs --dataset FILE_OR_NAME")
        check_count("max_length", args.max_length)
        examples = load_qa_dataset(args.dataset, args.split, limit=args.limit, fields=args.fields)
        return TuneTask.dataset(examples, str(args.dataset), args.max_length)
    depths = trial_grid.parse_depths(args.depths)
    if not args.lengths:
        raise HeadprobeError("--lengths: give at least one")
    for length in args.lengths:
        check_count("lengths", length)
    haystack = load_haystack(args.haystack)
    if args.task == "babi":
        return TuneTask.babi(args.babi_count, args.babi_tasks, args.seed, args.lengths, depths, haystack)
    path = args.needles or str(shipped_needle_file("retrieval"))
    return TuneTask.needles(path, args.needle_ids, args.lengths, depths, haystack)


def _capacities(args: argparse.Namespace, identity) -> tuple[list[int], dict | None]:
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.sizes import parse_bytes, parse_share
    from headprobe.tune.memory import MemoryTarget, cache_dtype, capacity_for

    if args.cache_share is None and args.cache_bytes is None:
        if args.context is not None:
            raise HeadprobeError("--context goes with --cache-share or --cache-bytes")
        caps = args.capacities or [64]
        for c in caps:
            check_count("capacities", c)
        if len(set(caps)) != len(caps):
            raise HeadprobeError(f"--capacities {' '.join(map(str, caps))}: a capacity given twice")
        return list(caps), None
    if args.context is None:
        raise HeadprobeError(f"{'--cache-share' if args.cache_share else '--cache-bytes'} needs --context N (the "
                             "prompt tokens the target is for)")
    check_count("context", args.context)
    share = parse_share(args.cache_share) if args.cache_share is not None else None
    size = parse_bytes(args.cache_bytes) if args.cache_bytes is not None else None
    target = MemoryTarget(args.context, share, size, cache_dtype(args.dtype, args.device),
                          args.max_new_tokens)
    cap, record = capacity_for(target, identity)
    return [cap], record


def run(args: argparse.Namespace) -> int:
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.distributed.ranks import process_group

    with process_group(args.device) as ranks:     # one process unless started by torchrun
        return _tune(args, ranks)


def _tune(args: argparse.Namespace, ranks: Ranks) -> int:
    # loads torch and transformers (numpy for the others): imported when the command runs, not for --help
    from headprobe.eval.settings import EVAL_PRESETS, expand_specs, parse_settings
    from headprobe.explain.model_shape import model_shape
    from headprobe.tune.candidates import tune_profiles
    from headprobe.tune.halving import HalvingRule
    from headprobe.tune.plan import plan_trials
    from headprobe.tune.report import check_tune_outputs, format_tune_report, write_tune_outputs
    from headprobe.tune.request import TuneRequest, TuneTask
    from headprobe.tune.runner import run_tune
    from headprobe.tune.space import SearchSpace, count_candidates, parse_tune_values
    from headprobe.tune.space_check import ShapeOnly, check_tune_space

    if args.resume and args.force:
        raise HeadprobeError("--resume with --force: choose one (--resume continues the eval runs, --force starts "
                             "them over)")
    check_task_flags(args, TASKS)       # a flag of another task would be ignored
    check_count("max_new_tokens", args.max_new_tokens)
    chat_template = chat_template_wanted(args)          # a contradiction fails before the model loads
    rule = HalvingRule(args.eta, args.level, args.resamples, args.seed)
    space = SearchSpace(tuple(args.policies or ()), tuple(args.allocations or ()),
                        parse_tune_values(args.values), tuple(args.head_kinds or ()),
                        args.keep_selections, not args.no_preset_candidates)
    space.check()
    presets = parse_settings(list(args.presets) if args.presets is not None else list(EVAL_PRESETS))
    for s in expand_specs(presets, [64]):      # parsed once: the tune expands these at its capacities
        s.check_policy()
    identity = model_shape(args.model)        # the model's shape, without its weights
    capacities, memory = _capacities(args, identity)
    found = tune_profiles(identity)
    n_sel, n_alloc = count_candidates(space, found)
    if max(n_sel, n_alloc) > args.max_candidates:
        raise HeadprobeError(f"--max-candidates {args.max_candidates}: the space has {n_sel} selections and up to "
                             f"{n_alloc} allocation-stage candidates per capacity; narrow it (--policies, "
                             "--allocations, --head-kinds, --values) or raise --max-candidates")
    out = Path(args.out)
    plot = output_figure(args.plot, out)
    if ranks.is_main:
        check_tune_outputs(out, capacities, plot, args.resume, args.force)
    task = _task(args)
    held = TuneTask.ruler_ids(task.generation[1]) if task.generation else args.holdout_ids
    split = split_items(task.ids, held, args.holdout_share, args.seed)
    request = TuneRequest(capacities, space, split, task, rule, presets, args.max_new_tokens,
                          chat_template, not args.no_shared_prefill, memory=memory)
    # nothing to race: refused before the load; the run takes the candidates and budgets made here (from the shape)
    checked = check_tune_space(ShapeOnly(identity), request, found)
    if ranks.is_main:
        print(f"tune: {len(split.calibration)} calibration items ({', '.join(split.calibration)}), "
              f"{len(split.holdout)} held out ({', '.join(split.holdout)}); capacities {capacities}; "
              f"{n_sel} selections, up to {n_alloc} allocation-stage candidates per capacity; "
              f"{plan_trials(request, n_sel, n_alloc).describe()}")
    lm = load_model(args, ranks)
    resolve_prompt_format(args, lm.tokenizer)           # --prompt-format chat without a template: refused here

    def progress(description: str, total: int):
        return tqdm_progress(total, description)

    outcome = run_tune(lm, request, out, ranks, resume=args.resume, force=args.force,
                       progress=progress, candidates=checked)
    if not ranks.is_main:
        rank_note(ranks, "done; rank 0 writes the report")
        return 0
    report = write_tune_outputs(lm, outcome, out, plot, resumed=args.resume,
                                replace=bool(args.force or args.resume))
    print(format_tune_report(report))
    for name in report["files"].values():
        print(f"wrote {out.parent / name}")
    return 0
