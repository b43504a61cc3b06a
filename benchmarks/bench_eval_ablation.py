"""Head ablation: needle accuracy with a profile's top-k heads masked versus k random heads.

Usage::

    python benchmarks/bench_eval_ablation.py [--model smollm2-135m] [--kind retrieval] [--k 5 10 20]
        [--lengths 1000] [--depths 0.25 0.75] [--needle-ids r01 r02]

A masked head attends uniformly to every key it may see (:class:`headprobe.HeadAblation`); the random
heads exclude the top-k. Prints one row per k.
"""

from __future__ import annotations

import argparse

import torch

import headprobe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--kind", default="retrieval")
    ap.add_argument("--k", nargs="+", type=int, default=[5, 10, 20])
    ap.add_argument("--lengths", nargs="+", type=int, default=[1000])
    ap.add_argument("--depths", nargs="+", type=float, default=[0.25, 0.75])
    ap.add_argument("--needle-ids", nargs="+", default=["r01", "r02"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = headprobe.load_model(args.model)
    profile = headprobe.newest_profile(lm.identity, args.kind).profile
    items = headprobe.items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"),
                                                                args.needle_ids))
    result = headprobe.run_ablation(lm, profile, args.k, items, args.lengths, args.depths,
                                    headprobe.load_haystack(), args.seed, args.max_new_tokens)
    print(f"{lm.identity.name}: {args.kind} heads, lengths {args.lengths}, depths {args.depths}, "
          f"{len(items)} needles")
    print(headprobe.format_ablation(result))


if __name__ == "__main__":
    main()
