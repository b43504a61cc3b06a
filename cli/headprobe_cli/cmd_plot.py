"""``headprobe plot``: pictures of profiles and budget maps."""

from __future__ import annotations

import argparse
from pathlib import Path

from headprobe.budget_map import BudgetMap
from headprobe.errors import HeadprobeError
from headprobe.eval.result import EvalResult
from headprobe.file_summary import load_file

from .common_args import LazyChoices, add_force_argument, plot_formats

KINDS = ("auto", "heads", "compare", "retention", "budget", "eval")


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Plot one profile (head heatmap or layer-retention curves), two profiles side by side, a "
        "budget map, or an eval result (RULER: score per task against the cache held; a dataset run: "
        "accuracy against cache memory; needles: the needle grid). PNG by default; --format svg or a .svg "
        "output for SVG."
    )
    p.epilog = (
        "examples:\n  headprobe plot profiles/smollm2-135m.retrieval_reasoning.json\n"
        "  headprobe plot r.json r2.json -o compare.png\n  headprobe plot budgets/x.json --format svg\n"
        "  headprobe plot results/ruler.json"
    )
    p.add_argument("inputs", nargs="+", help="one or two profile files, a budget file or an eval result")
    p.add_argument("--kind", default="auto", choices=KINDS, help="what to draw (default: from the input)")
    p.add_argument("--granularity", default="query", choices=["query", "kv"], help="query or KV heads")
    p.add_argument("--top-k", type=int, default=5, help="heads to box and number")
    p.add_argument("--format", default=None, choices=LazyChoices(plot_formats), metavar="FORMAT",
                   help="image format: %(choices)s (default png)")
    p.add_argument("-o", "--output", default=None, help="image file (default: next to the input)")
    add_force_argument(p, "an existing image")
    p.set_defaults(func=run)


def run(args) -> int:
    if len(args.inputs) > 2:
        raise HeadprobeError("plot takes one or two files")
    objs = [load_file(path) for path in args.inputs]
    kind = args.kind
    if kind == "auto":
        if isinstance(objs[0], EvalResult):
            kind = "eval"
        elif len(objs) == 2:
            kind = "compare"
        elif isinstance(objs[0], BudgetMap):
            kind = "budget"
        else:
            kind = "heads" if objs[0].query_heads is not None else "retention"
    if (kind == "eval") != any(isinstance(o, EvalResult) for o in objs):
        raise HeadprobeError("--kind eval takes one eval result; the other kinds take profiles or a budget "
                             "map")
    need_two = kind == "compare"
    if need_two != (len(objs) == 2):
        raise HeadprobeError("--kind compare takes two profiles; the other kinds take one file")
    if kind == "budget" and not isinstance(objs[0], BudgetMap):
        raise HeadprobeError("--kind budget needs a budget file")
    if kind not in ("eval", "budget") and any(isinstance(o, BudgetMap) for o in objs):
        raise HeadprobeError(f"--kind {kind} needs profile files, not a budget map")
    fmt = args.format or (Path(args.output).suffix.lstrip(".") if args.output else "") or "png"
    out = args.output or str(Path(args.inputs[0]).with_suffix("")) + f".{kind}.{fmt}"
    path = _draw(kind, objs, args, out, fmt)
    print(f"wrote {path}")
    return 0


def _draw(kind: str, objs: list, args, out: str, fmt: str) -> Path:
    """The figure of ``kind`` for the files read (checked already), saved to ``out``."""
    # loads matplotlib: imported when the command runs, not for --help
    from headprobe.plots.profile_figures import (
        budget_heatmap,
        compare_heatmaps,
        head_heatmap,
        retention_curves,
        save_figure,
    )

    if kind == "eval":
        fig = _eval_figure(objs[0])
    elif kind == "budget":
        fig = budget_heatmap(objs[0], top_k=args.top_k)
    elif kind == "compare":
        fig = compare_heatmaps(objs[0], objs[1], granularity=args.granularity, top_k=args.top_k)
    elif kind == "retention":
        fig = retention_curves(objs[0])
    else:
        fig = head_heatmap(objs[0], granularity=args.granularity, top_k=args.top_k)
    return save_figure(fig, out, fmt=fmt, force=args.force)


def _eval_figure(result):
    """What ``eval`` draws for the result's task: RULER's per-task scores, a dataset's accuracy against
    memory, or the needle grid."""
    # loads matplotlib: imported when the command runs, not for --help
    from headprobe.plots.eval_figures import accuracy_vs_memory, needle_grid, ruler_vs_memory

    task = result.task.get("kind")
    if task == "ruler":
        return ruler_vs_memory(result)
    if task == "dataset":
        return accuracy_vs_memory(result)
    return needle_grid(result)
