"""Fast versus reference profiling mode on the same trials, in one run.

Prints, per length: seconds per trial and peak memory of each mode, each mode's speed-up over the
reference mode, the Spearman correlation of its score map with the reference's over all heads and the
overlap of their top-10 heads. ``fast-masked`` is fast mode with its prompt forward run as one masked
SDPA call instead of the prefix/suffix split (to measure what the split gains).

    python benchmarks/bench_profile_modes.py --lengths 1000 2000 4000 --probe retrieval_reasoning
    python benchmarks/bench_profile_modes.py --model /path/to/7b --device cuda --lengths 8000
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

import headprobe


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=None)
    parser.add_argument("--lengths", nargs="+", type=int, default=[1000, 2000, 4000])
    parser.add_argument("--depths", nargs="+", type=float, default=[0, 25, 50, 75, 100])
    parser.add_argument("--probe", default="retrieval_reasoning",
                        choices=["retrieval", "enhanced_retrieval", "retrieval_reasoning"])
    parser.add_argument("--needles", nargs="+", help="needle ids (default: all of the probe's set)")
    parser.add_argument("--gate", default="likelihood", choices=["published", "likelihood"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=["reference", "fast"],
                        choices=["reference", "fast", "fast-masked"])
    args = parser.parse_args()

    loaded = headprobe.load_model(args.model, device=args.device)
    device = str(loaded.device)
    print(f"model {loaded.identity.name} on {device}, torch threads {torch.get_num_threads()}")
    print(f"{'length':>6} {'mode':>11} {'trials':>6} {'passed':>6} {'s/trial':>8} {'peak MB':>8}")
    for length in args.lengths:
        maps = {}
        seconds = {}
        for mode in args.modes:
            out = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-"))
            request = headprobe.ProfileRequest(
                probes=[args.probe], lengths=[length], depths=[d / 100 for d in args.depths],
                out_dir=out, mode=mode.split("-")[0], needle_ids=args.needles, gate=args.gate,
                batch_size=args.batch_size, split_attention=mode != "fast-masked")
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            result = headprobe.run_profile(loaded, request)
            elapsed = time.perf_counter() - start
            trials = result.trials_run
            seconds[mode] = elapsed / max(1, trials)
            _, records = headprobe.read_log(result.logs[0])
            passed = sum(1 for r in records if r["gates"].get("likelihood" if args.probe == "retrieval_reasoning"
                                                               and args.gate == "likelihood" else "published"))
            print(f"{length:>6} {mode:>11} {trials:>6} {passed:>6} {seconds[mode]:>8.2f} {peak_memory_mb(device):>8.0f}")
            profile = out / f"{headprobe.frontend.model_slug(loaded.identity.name)}.{args.probe}.json"
            if profile.exists():
                maps[mode] = np.array(headprobe.Profile.load(profile).query_heads).ravel()
        for mode in maps:
            if mode == "reference" or "reference" not in maps:
                continue
            rho = spearmanr(maps[mode], maps["reference"])[0]
            top = len(set(np.argsort(-maps[mode])[:10]) & set(np.argsort(-maps["reference"])[:10]))
            print(f"{length:>6} {mode}: speed-up {seconds['reference'] / seconds[mode]:.2f}x; "
                  f"Spearman {rho:.3f}; top-10 overlap {top}/10")


if __name__ == "__main__":
    main()
