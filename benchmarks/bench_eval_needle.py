"""Needle-in-a-haystack accuracy against real KV-cache bytes, one short table.

Usage::

    python benchmarks/bench_eval_needle.py [--model smollm2-135m] [--settings full snapkv headkv-r2]
        [--capacities 32 128] [--lengths 1000] [--depths 50] [--needle-ids r01 r02] [--task needle|babi]

Runs :func:`headprobe.run_eval` (the library behind ``headprobe eval``) into a temporary folder and
prints, per setting: mean accuracy, allocated cache MiB, its share of a full cache, ms per generated
token (whole ``generate`` call, prefill included, divided by the tokens generated).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import headprobe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--settings", nargs="+", default=["full", "snapkv", "headkv-r2"])
    ap.add_argument("--capacities", nargs="+", type=int, default=[32, 128])
    ap.add_argument("--lengths", nargs="+", type=int, default=[1000])
    ap.add_argument("--depths", nargs="+", type=float, default=[0.5])
    ap.add_argument("--needle-ids", nargs="+", default=["r01", "r02"])
    ap.add_argument("--task", choices=["needle", "babi"], default="needle")
    ap.add_argument("--babi-count", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = headprobe.load_model(args.model)
    if args.task == "babi":
        items = headprobe.items_from_babi(headprobe.generate_questions(args.babi_count))
    else:
        items = headprobe.items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"),
                                                                    args.needle_ids))
    req = headprobe.EvalRequest(headprobe.expand_settings(args.settings, args.capacities), items, args.lengths,
                                args.depths, headprobe.load_haystack(), {"kind": args.task}, args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        result = headprobe.run_eval(lm, req, Path(tmp) / "eval.json")
    print(f"{lm.identity.name}: {args.task}, lengths {args.lengths}, depths {args.depths}, {len(items)} items")
    print(headprobe.format_eval_summary(result))


if __name__ == "__main__":
    main()
