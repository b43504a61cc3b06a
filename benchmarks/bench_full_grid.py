"""Wall time of the full HeadKV grid (5 lengths up to 10K or the model's context, 10 depths, all needles,
all probes), measured on every (length, depth) cell with a few needles and scaled to all of them.

In fast mode a trial's cost depends on its length and depth, not on which needle it carries (batching
gains nothing on a CPU), and each length pays once for the haystack prefix shared by all its trials.
The script runs the whole grid with ``--needles-per-kind`` needles of each kind, times that prefix
forward at every length separately, and prints

    needle pass time for all needles = sum over lengths of (prefix + all_needles / sample * (trials - prefix))

next to the measured sample time. Layer retention does not depend on the grid and is timed in full.
Reuse mode (``--mode reuse``) pays one haystack forward per length the same way, so the same scaling holds.

    python benchmarks/bench_full_grid.py                        # SmolLM2 on this machine
    python benchmarks/bench_full_grid.py --mode reuse           # at the default recompute share
    python benchmarks/bench_full_grid.py --model mistral-7b     # on a GPU
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import headprobe


def prefix_seconds(loaded, length: int, repeats: int = 1) -> float:
    """Seconds of one causal forward over ``length`` haystack tokens (what a length group pays once)."""
    ids = torch.randint(100, 1000, (1, length), device=loaded.device)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            loaded.model(input_ids=ids, logits_to_keep=1)
            if loaded.device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=None)
    parser.add_argument("--needles-per-kind", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--mode", default="fast", choices=list(headprobe.MODES))
    parser.add_argument("--recompute-share", type=float, default=100 * headprobe.frontend.DEFAULT_RECOMPUTE_SHARE,
                        metavar="PCT", help="reuse mode: percent of the haystack after the needle recomputed")
    parser.add_argument("--skip-retention", action="store_true", help="time the needle passes only")
    parser.add_argument("--out-dir", default=None, help="keep the sample's logs here (default: a temp dir)")
    args = parser.parse_args()

    loaded = headprobe.load_model(args.model, device=args.device)
    lengths, depths, label = headprobe.frontend.trial_grid.full_grid(loaded.identity.max_context)
    print(f"model {loaded.identity.name} on {loaded.device}, torch threads {torch.get_num_threads()}; {label}: "
          f"lengths {list(lengths)}; {args.mode} mode"
          + (f", recompute share {args.recompute_share:g}%" if args.mode == "reuse" else ""))
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="full-grid-"))
    total_estimate = 0.0
    for kind, probe in (("retrieval", "retrieval"), ("reasoning", "retrieval_reasoning")):
        needles = headprobe.load_needles(headprobe.shipped_needle_file(kind))
        sample = [n.id for n in needles[:args.needles_per_kind]]
        request = headprobe.ProfileRequest(probes=[probe], lengths=list(lengths), depths=list(depths), out_dir=out,
                                           needle_ids=sample, batch_size=args.batch_size, mode=args.mode,
                                           recompute_share=headprobe.frontend.parse_recompute_share(args.recompute_share))
        start = time.perf_counter()
        result = headprobe.run_profile(loaded, request)
        measured = time.perf_counter() - start
        _, records = headprobe.read_log(result.logs[0])
        estimate = 0.0
        for length in lengths:
            group = [r for r in records if r["length"] == length]
            spent = sum(r["seconds"] for r in group)            # prefix share included in each trial's seconds
            prefix = prefix_seconds(loaded, length)
            estimate += prefix + len(needles) / len(sample) * max(0.0, spent - prefix)
            print(f"  {kind} length {length}: {len(group)} trials, {spent:.0f} s, prefix forward {prefix:.1f} s")
        print(f"{kind}: sample of {len(sample)} of {len(needles)} needles x {len(lengths)} lengths x "
              f"{len(depths)} depths = {len(records)} trials in {measured:.0f} s; "
              f"all needles: about {estimate / 60:.0f} min")
        total_estimate += estimate
    if not args.skip_retention:
        request = headprobe.ProfileRequest(probes=["layer_retention"], lengths=list(lengths), depths=list(depths),
                                           out_dir=out)
        start = time.perf_counter()
        headprobe.run_profile(loaded, request)
        retention = time.perf_counter() - start
        total_estimate += retention
        print(f"layer retention: {retention:.0f} s")
    print(f"full grid, all needles, all probes: about {total_estimate / 3600:.1f} h")


if __name__ == "__main__":
    main()
