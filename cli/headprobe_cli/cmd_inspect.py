"""``headprobe inspect``: validate and summarise any headprobe file."""

from __future__ import annotations

import headprobe


def register(sub, formatter) -> None:
    p = sub.add_parser("inspect", formatter_class=formatter, help="validate and summarise a headprobe file",
                       description="Validate a profile, budget map, trial log, eval cell log or ablation run log "
                                   "and print a summary: model, trial counts and pass rate per needle, top "
                                   "heads, budget totals, cells or runs finished.",
                       epilog="example:\n  headprobe inspect profiles/smollm2-135m.retrieval_reasoning.json")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--top", type=int, default=10, help="how many top heads to list")
    p.set_defaults(func=run)


def run(args) -> int:
    for i, path in enumerate(args.files):
        if i:
            print()
        for line in headprobe.summarize_file(path, top=args.top):
            print(line)
    return 0
