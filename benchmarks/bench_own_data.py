"""Agreement of profiles made on a user's own examples with the needle profiles, and the accuracy their
budgets keep on held-out examples.

    python benchmarks/bench_own_data.py agree OWN.json... --against profiles/smollm2-135m.retrieval.json ...
    python benchmarks/bench_own_data.py accuracy EVAL_RESULT.json...

``agree``: per pair, Spearman's rank correlation over every query head's score, and how many of the top-10
and top-20 heads the two share (ties broken as headprobe ranks heads: the lower layer and head first).
``accuracy``: per setting of ``headprobe eval --task dataset`` results, the mean token-F1 with a bootstrap
90% interval over the examples (1000 resamples, seed 0), the cache bytes, and the paired differences to
the ``--baseline`` setting (default: ``snapkv``, SnapKV's uniform budgets) and each ``--also`` setting at the
same capacity.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from headprobe import Profile
from headprobe.head_ranking import rank_order


def top_k(scores: np.ndarray, k: int) -> set[int]:
    return set(rank_order(scores.reshape(-1))[:k].tolist())


def agree(own: list[str], against: list[str]) -> None:
    print("| own-data profile | needle profile | Spearman | top-10 shared | top-20 shared |")
    print("|---|---|---|---|---|")
    for a in own:
        pa = Profile.load(a)
        sa = np.array(pa.query_heads, dtype=np.float64)
        for b in against:
            sb = np.array(Profile.load(b).query_heads, dtype=np.float64)
            rho = spearmanr(sa.reshape(-1), sb.reshape(-1)).statistic
            print(f"| {Path(a).name} | {Path(b).name} | {rho:.3f} | {len(top_k(sa, 10) & top_k(sb, 10))}/10 | "
                  f"{len(top_k(sa, 20) & top_k(sb, 20))}/20 |")


def _cells(path: str) -> dict[str, dict]:
    result = json.loads(Path(path).read_text())
    return {cell["setting"]: cell for cell in result["cells"]}


def _capacity(label: str) -> str | None:
    """The ``@capacity`` suffix of a setting label (``None`` for the full cache)."""
    return label.rsplit("@", 1)[1] if "@" in label else None


def _paired(s: np.ndarray, base: np.ndarray, draws: np.ndarray) -> str:
    d = (s - base)[draws].mean(axis=1)
    return f"{(s - base).mean():+.3f} ({np.quantile(d, 0.05):+.3f}, {np.quantile(d, 0.95):+.3f})"


def accuracy(paths: list[str], baseline: str, also: list[str], resamples: int = 1000) -> None:
    """Mean token-F1 per setting, and paired differences to ``baseline`` and each of ``also`` (setting names
    without ``@capacity``) at the setting's own capacity."""
    cells: dict[str, dict] = {}
    for path in paths:
        cells.update(_cells(path))
    rng = np.random.default_rng(0)
    scores = {label: np.array([t["score"] for t in cell["trials"]], dtype=np.float64) for label, cell in cells.items()}
    n = len(next(iter(scores.values())))
    draws = rng.integers(0, n, size=(resamples, n))
    against = [baseline, *also]
    print("| setting | mean F1 | 90% interval | cache bytes | "
          + " | ".join(f"minus {name} (90% interval)" for name in against) + " |")
    print("|---|---|---|---|" + "---|" * len(against))
    for label, s in scores.items():
        low, high = np.quantile(s[draws].mean(axis=1), [0.05, 0.95])
        diffs = []
        for name in against:
            other = f"{name}@{_capacity(label)}" if _capacity(label) else None
            diffs.append(_paired(s, scores[other], draws) if other in scores and other != label else "")
        cache = cells[label].get("cache_bytes", cells[label].get("mean_cache_bytes", ""))
        cache = f"{cache:,.0f}" if isinstance(cache, float | int) else cache
        print(f"| {label} | {s.mean():.3f} | {low:.3f}-{high:.3f} | {cache} | " + " | ".join(diffs) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("agree")
    a.add_argument("own", nargs="+")
    a.add_argument("--against", nargs="+", required=True)
    b = sub.add_parser("accuracy")
    b.add_argument("results", nargs="+")
    b.add_argument("--baseline", default="snapkv", help="setting name compared with at each capacity")
    b.add_argument("--also", nargs="*", default=[], help="more setting names compared with at each capacity")
    args = parser.parse_args()
    if args.what == "agree":
        agree(args.own, args.against)
    else:
        accuracy(args.results, args.baseline, args.also)


if __name__ == "__main__":
    main()
