"""``headprobe ablate``: mask a profile's top-k heads versus k random heads and measure needle accuracy."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from headprobe.errors import HeadprobeError
from headprobe.eval.items import items_from_needles
from headprobe.files.jsonio import atomic_write_json, check_writable_dir
from headprobe.haystack.corpus import load_haystack
from headprobe.haystack.needles import load_needles, shipped_needle_file
from headprobe.limits import check_count
from headprobe.probes import trial_grid

from .common_args import (
    add_loading_arguments,
    add_prompt_format_arguments,
    add_rerun_arguments,
    chat_template_wanted,
    load_model,
    output_figure,
    rank_note,
    resolve_prompt_format,
)
from .progress import tqdm_progress

if TYPE_CHECKING:
    from headprobe.distributed.ranks import Ranks

#: Library parameters whose flag is not ``--`` + the parameter name (errors name them by these flags).
FLAGS = {"ks": "--k"}


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Wu et al.'s check that retrieval heads are real: make the attention of the profile's "
        "top-k query heads uniform and compare needle accuracy with k random heads masked."
    )
    p.epilog = (
        "examples:\n"
        "  headprobe ablate --k 5 10 20 --lengths 1000\n"
        "  headprobe ablate --profile profiles/smollm2-135m.retrieval.json --out ablation.json\n"
        "  torchrun --standalone --nproc-per-node 3 -m headprobe ablate ...   # runs split over 3 ranks"
    )
    add_loading_arguments(p)
    p.add_argument("--profile", default=None, help="profile file (default: newest --kind profile of the model)")
    p.add_argument("--kind", default="retrieval", help="profile kind to look up when --profile is not given")
    p.add_argument("--k", nargs="+", type=int, default=[5, 10, 20], help="numbers of heads to mask")
    p.add_argument("--needles", default=None, help="needle file (default: the shipped retrieval needles)")
    p.add_argument("--needle-ids", nargs="+", default=None)
    p.add_argument("--haystack", default=None)
    p.add_argument("--lengths", nargs="+", type=int, default=[1000])
    p.add_argument("--depths", nargs="+", type=float, default=[25, 75], help="percent")
    p.add_argument("--seed", type=int, default=0, help="seed of the random heads")
    p.add_argument("--max-new-tokens", type=int, default=32)
    add_prompt_format_arguments(p)
    p.add_argument("--out", default="eval/ablation.json")
    p.add_argument("--plot", default=None, help="PNG bars (default: beside --out); 'none' to skip")
    add_rerun_arguments(p, log="its run log", replaced="--out, its figure and its run log")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.distributed.ranks import process_group

    with process_group(args.device) as ranks:     # one process unless started by torchrun
        return _ablate(args, ranks)


def _ablate(args: argparse.Namespace, ranks: Ranks) -> int:
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.allocation.api import newest_profile
    from headprobe.distributed.ablation_ranks import run_ablation_on_ranks
    from headprobe.eval.ablation import ablation_log_path, check_ablation_outputs, format_ablation
    from headprobe.profile import Profile

    out = Path(args.out)
    log = ablation_log_path(out)
    mine = ranks.part_path(log)                              # each rank keeps its own under torchrun
    if mine != log and mine.exists() and not (args.force or args.resume):
        raise HeadprobeError(f"{mine} exists; pass --resume to continue or --force to start over")
    check_writable_dir(out.parent if str(out.parent) else Path("."))
    check_count("max_new_tokens", args.max_new_tokens)
    chat_template = chat_template_wanted(args)
    plot = output_figure(args.plot, out)
    if ranks.is_main:   # the merged outputs are rank 0's to write; every rank checks its own log below
        check_ablation_outputs(out, [plot] if plot else [], resume=args.resume, force=args.force)
    # what is there now this run may replace (the check allowed it); what another run writes meanwhile is refused
    replaceable = {f for f in (out, plot) if f is not None and (args.force or f.exists())}
    if any(k < 1 for k in args.k):
        raise HeadprobeError(f"--k {args.k}: expected positive numbers of heads")
    path = args.needles or str(shipped_needle_file("retrieval"))
    items = items_from_needles(load_needles(path, args.needle_ids))
    haystack = load_haystack(args.haystack)
    depths = trial_grid.parse_depths(args.depths)
    profile = Profile.load(args.profile) if args.profile else None
    lm = load_model(args, ranks)
    resolve_prompt_format(args, lm.tokenizer)
    if profile is None:
        profile = newest_profile(lm.identity, args.kind).profile
    runs = ranks.mine(range(1 + 2 * len(set(args.k))))          # baseline, top-k and random-k: those run here
    trials = len(items) * len(args.lengths) * len(depths) * len(runs)
    progress = tqdm_progress(trials, "ablate") if ranks.is_main else None     # bars on rank 0 only
    result = run_ablation_on_ranks(lm, profile, list(args.k), items, list(args.lengths), depths, haystack,
                                   ranks, args.seed, args.max_new_tokens, chat_template,
                                   progress, log_path=log, resume=args.resume, force=args.force)
    if result is None:
        rank_note(ranks, f"{len(runs)} runs; log {mine}")
        return 0
    result["needles"] = path
    if plot is not None:      # listed, so that a resumed run may rewrite it
        result["figures"] = [Path(os.path.relpath(plot.resolve(), out.parent.resolve())).as_posix()]
    atomic_write_json(out, result, overwrite=out in replaceable)
    print(format_ablation(result))
    print(f"wrote {out}")
    if plot is not None:      # replacing it was settled by check_ablation_outputs
        print(f"wrote {_save_bars(result, plot, force=plot in replaceable)}")
    return 0


def _save_bars(result: dict, plot: Path, force: bool) -> Path:
    """The accuracy bars of the runs (``--plot``)."""
    # loads matplotlib: imported when a figure is drawn, not for --help
    from headprobe.plots.eval_figures import ablation_bars
    from headprobe.plots.profile_figures import save_figure

    return save_figure(ablation_bars(result), plot, force=force)
