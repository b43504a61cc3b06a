"""``headprobe inspect``: validate and summarise any headprobe file."""

from __future__ import annotations

import argparse


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Validate a profile, budget map, trial log, eval cell log or ablation run log "
        "and print a summary: model, trial counts and pass rate per needle, top "
        "heads, budget totals, cells or runs finished."
    )
    p.epilog = "example:\n  headprobe inspect profiles/smollm2-135m.retrieval_reasoning.json"
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--top", type=int, default=10, help="how many top heads to list")
    p.set_defaults(func=run)


def run(args) -> int:
    # loads numpy: imported when the command runs, not for --help
    from headprobe.file_summary import summarize_file

    for i, path in enumerate(args.files):
        if i:
            print()
        for line in summarize_file(path, top=args.top):
            print(line)
    return 0
