"""Tables and the figure of reuse mode's speed/agreement curve from ``bench_reuse_curve.py`` results.

    python benchmarks/reuse_tables.py reuse_curve/retrieval.json reuse_curve/reasoning.json \\
        --plot docs/figures/reuse_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import headprobe
from headprobe.plots.profile_figures import plt

LABELS = {"retrieval": "R (copy)", "enhanced_retrieval": "ER", "retrieval_reasoning": "R2"}


def table(result: dict) -> str:
    kinds = list(result["reuse"][0]["agreement"])
    head = ("| share | s/trial | CPU s/trial | speed-up (wall) | speed-up (CPU) | "
            + " | ".join(f"{LABELS[k]} Spearman | {LABELS[k]} top-10 | {LABELS[k]} top-20 | {LABELS[k]} gate flips"
                         for k in kinds) + " |")
    rule = "|" + "---:|" * (5 + 4 * len(kinds))
    fast = result["fast"]
    lines = [head, rule,
             f"| fast (exact) | {fast['seconds_per_trial']:.2f} | {fast.get('cpu_seconds_per_trial', float('nan')):.2f} "
             "| 1 | 1 | " + " | ".join("1.000 | 10 | 20 | 0" for _ in kinds) + " |"]
    for row in result["reuse"]:
        agree = " | ".join(f"{a['spearman']:.3f} | {a['top10']} | {a['top20']} | {a['gate_flips']}"
                           for a in row["agreement"].values())
        lines.append(f"| {row['share_percent']:g}% | {row['seconds_per_trial']:.2f} | "
                     f"{row.get('cpu_seconds_per_trial', float('nan')):.2f} | {row['speedup']:.2f}x | "
                     f"{row.get('cpu_speedup', float('nan')):.2f}x | {agree} |")
    return "\n".join(lines)


def length_table(result: dict) -> str:
    """Seconds per length (sum of the trials' own seconds, haystack forward included) and their ratio."""
    lengths = list(result["fast"]["seconds_by_length"])
    lines = ["| share | " + " | ".join(f"{length}" for length in lengths) + " |", "|---" + "|---:" * len(lengths) + "|",
             "| fast (s) | " + " | ".join(f"{result['fast']['seconds_by_length'][n]:.0f}" for n in lengths) + " |"]
    fast = result["fast"]["seconds_by_length"]
    for row in result["reuse"]:
        own = row["seconds_by_length"]
        cells = [f"{own[n]:.0f} ({fast[n] / own[n]:.1f}x)" if n in own else "—" for n in lengths]
        lines.append(f"| {row['share_percent']:g}% (s) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(results: list[dict]):
    fig, (speed, agree) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, result in enumerate(results):
        shares = [row["share_percent"] for row in result["reuse"]]
        probe = "retrieval" if result["probe"] == "retrieval" else "retrieval-reasoning"
        speed.plot(shares, [row["speedup"] for row in result["reuse"]], marker="o", color=f"C{i}",
                   label=f"{probe} (wall)")
        speed.plot(shares, [row.get("cpu_speedup") for row in result["reuse"]], marker="s", linestyle="--",
                   color=f"C{i}", label=f"{probe} (CPU time)")
        for j, kind in enumerate(result["reuse"][0]["agreement"]):
            agree.plot(shares, [row["agreement"][kind]["spearman"] for row in result["reuse"]], marker="o",
                       color=f"C{2 * i + j}", label=f"{LABELS[kind]} Spearman")
            agree.plot(shares, [row["agreement"][kind]["top20"] / 20 for row in result["reuse"]], marker="^",
                       linestyle=":", color=f"C{2 * i + j}", label=f"{LABELS[kind]} top-20 overlap / 20")
    speed.axhline(10, color="grey", linestyle="--", linewidth=1)
    speed.text(1, 10.3, "target 10x", color="grey", fontsize=8)
    speed.set_xscale("symlog", linthresh=5)
    speed.set_xlabel("recompute share of the haystack after the needle (%)")
    speed.set_ylabel("speed-up over exact fast mode")
    speed.set_title("time per trial", fontsize=10)
    speed.grid(alpha=0.3)
    speed.legend(fontsize=8)
    agree.axhline(0.95, color="grey", linestyle="--", linewidth=1)
    agree.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    agree.text(0.2, 0.952, "Spearman 0.95", color="grey", fontsize=8)
    agree.text(0.2, 0.902, "top-20 overlap 18/20", color="grey", fontsize=8)
    agree.set_xscale("symlog", linthresh=5)
    agree.set_xlabel("recompute share of the haystack after the needle (%)")
    agree.set_ylabel("agreement with exact fast mode")
    agree.set_title("head ranking against exact fast mode", fontsize=10)
    agree.grid(alpha=0.3)
    agree.legend(fontsize=7, loc="lower right")
    first = results[0]
    fig.suptitle(f"{first['model'].split('/')[-1]}: reuse mode over the recompute share "
                 f"(lengths {', '.join(map(str, first['lengths']))}; {len(first['depths'])} depths; "
                 f"{len(first['needles'])} needles per kind)", fontsize=11)
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+")
    parser.add_argument("--plot", help="write the figure here")
    args = parser.parse_args()
    results = [json.loads(Path(p).read_text()) for p in args.results]
    for result in results:
        print(f"\n{result['probe']}: {result['trials']} trials, load {result['load_before']} -> {result['load_after']}, "
              f"peak RSS {result['peak_rss_mb']} MB, passed (fast) {result['fast']['passed']}\n")
        print(table(result))
        print()
        print(length_table(result))
    if args.plot:
        print(f"wrote {headprobe.save_figure(figure(results), args.plot, force=True)}")


if __name__ == "__main__":
    main()
