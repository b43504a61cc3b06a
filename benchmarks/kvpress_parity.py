"""Method parity with kvpress: the share of KV heads whose kept tokens agree, per method and ratio.

Usage (in an environment with kvpress, e.g. the one ``.ci/kvpress`` builds; headprobe runs there too)::

    OMP_NUM_THREADS=1 /path/to/kvpress-venv/bin/python benchmarks/kvpress_parity.py \\
        [--model smollm2-135m] [--prompts 20] [--ratios 0.5 0.75 0.9] [--out parity.json]

With ``--model gemma3-270m`` (read in kvpress's environment from the main one's conversion) only the layers
that attend every token are compared (:func:`~headprobe.library_bridges.press_parity.compressed_layers`:
neither side compresses a sliding-window layer) and DuoAttention is left out (no export of Gemma's profile).

Prompts: the model's tokens of a haystack headprobe does not ship (this Python's standard-library docstrings,
``benchmarks/stdlib_haystack.py``) with one of its needles inserted and its question after the text;
lengths spread from 500 to 2,000 tokens. For every prompt, ratio and method the same prompt is prefilled
by kvpress under its own press and by headprobe's compressed cache at the same number of kept tokens
(kvpress's ``compute_n_kept``), and the kept positions of every (layer, KV head) are compared
(:mod:`headprobe.library_bridges.press_parity`). Printed per method and ratio: heads whose kept tokens
agree exactly, heads that keep as many tokens, the mean Jaccard index; the first difference met.

DuoAttention (ratio ``pattern``: its pattern, not a ratio, decides what it keeps): headprobe's DuoAttention
export of SmolLM2's shipped retrieval-reasoning profile (sink 128, recent 256), run by kvpress's
``DuoAttentionPress`` (through ``DuoAttentionFolderPress``) and by headprobe as the budget map ``explain --to
budget`` converts it to at each prompt's length, with the streaming policy the map names.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def methods(n: int, ratio: float) -> dict:
    """Method → (kvpress press, headprobe policy, its options, a budget map builder or None)."""
    import kvpress

    snap = {"window": 32, "kernel_size": 5, "pooling": "avg"}
    return {
        "SnapKV": (kvpress.SnapKVPress(ratio, window_size=32, kernel_size=5), "snapkv", snap, None),
        "StreamingLLM": (kvpress.StreamingLLMPress(ratio, n_sink=4), "streaming", {"sink": 4, "window": 0}, None),
        "KeyDiff": (kvpress.KeyDiffPress(ratio), "keydiff", {"block_size": n, "anchor": "normalized"}, None),
        "AdaKV(SnapKV)": (kvpress.AdaKVPress(kvpress.SnapKVPress(ratio, window_size=32, kernel_size=5)), "snapkv",
                          {**snap, "adaptive": True, "floor_share": 0.2, "floor_of": "budget"}, None),
        "PyramidKV": (kvpress.PyramidKVPress(ratio, window_size=8, kernel_size=5, beta=20), "snapkv",
                      {**snap, "window": 8}, "pyramid"),
    }


def prompts(tokenizer, count: int) -> list:
    import torch
    from stdlib_haystack import NEEDLES, build_haystack

    text = build_haystack()
    out = []
    for i in range(count):
        length = 500 + round(1500 * i / max(count - 1, 1))
        _id, needle, question, _answer = NEEDLES[i % len(NEEDLES)]
        body = tokenizer(text, add_special_tokens=False).input_ids[i * 97: i * 97 + length]
        cut = len(body) * (i % 5 + 1) // 6
        ids = (body[:cut] + tokenizer(" " + needle + " ", add_special_tokens=False).input_ids + body[cut:]
               + tokenizer("\nQuestion: " + question, add_special_tokens=False).input_ids)
        out.append(torch.tensor([ids]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75, 0.9])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--methods", nargs="+", default=None,
                        help="only these (SnapKV StreamingLLM KeyDiff AdaKV(SnapKV) PyramidKV DuoAttention)")
    args = parser.parse_args()

    import tempfile

    import kvpress
    import torch
    import transformers
    from headprobe_cli.main import main as cli
    from kvpress.utils import compute_n_kept

    import headprobe
    from headprobe.library_bridges.kvpress import DuoAttentionFolderPress
    from headprobe.library_bridges.press_parity import (
        agreement,
        compressed_layers,
        full_keys,
        headprobe_kept,
        press_kept,
    )

    torch.manual_seed(0)
    lm = headprobe.load_model(args.model, device="cpu")
    layers = compressed_layers(lm.model)
    with_duo = args.model == "smollm2-135m" and (args.methods is None or "DuoAttention" in args.methods)
    found: dict = defaultdict(list)
    began = time.time()
    scratch = Path(tempfile.mkdtemp(prefix="parity-"))
    duo = scratch / "duo"
    if with_duo:
        cli(["export", str(headprobe.newest_profile(lm.identity, "retrieval_reasoning").path), "--to",
             "duoattention", "-o", str(duo)])
    for p, ids in enumerate(prompts(lm.tokenizer, args.prompts)):
        keys = full_keys(lm.model, ids)
        n = ids.shape[1]
        if with_duo:
            mapped = scratch / f"duo_{n}.json"
            cli(["explain", str(duo), "--model", "smollm2-135m", "--context", str(n), "--to", "budget", "-o",
                 str(mapped), "--force"])
            bm = headprobe.BudgetMap.load(mapped)
            theirs = press_kept(lm.model, DuoAttentionFolderPress(pattern_dir=duo), ids, keys)
            run = bm.method["run_with"]
            ours = headprobe_kept(lm, ids, run["policy"], run["options"], budget=bm)
            found[("DuoAttention", "pattern")].append(agreement(ours, theirs))
        for ratio in args.ratios:
            k = compute_n_kept(n, ratio)
            for name, (press, policy, options, alloc) in methods(n, ratio).items():
                if args.methods is not None and name not in args.methods:
                    continue
                budget = headprobe.allocate(alloc, [], lm.identity, capacity=k, window=0) if alloc else None
                if budget is not None and min(min(row) for row in budget.budgets) < options["window"]:
                    budget = None     # kvpress's PyramidKVPress falls back to SnapKV when a layer gets < window
                theirs = press_kept(lm.model, press, ids, keys)
                ours = headprobe_kept(lm, ids, policy, options, budget=budget, capacity=None if budget else k)
                found[(name, ratio)].append(agreement(ours, theirs, layers))
        print(f"prompt {p + 1}/{args.prompts} ({n} tokens) done at {time.time() - began:.0f} s", flush=True)
    rows = []
    print(f"\nkvpress {kvpress.__version__ if hasattr(kvpress, '__version__') else ''} transformers "
          f"{transformers.__version__} torch {torch.__version__}; {args.model}, {args.prompts} prompts, "
          f"layers {layers if len(layers) < lm.identity.num_layers else 'all'}")
    print(f"{'method':<15} {'ratio':>5} {'same tokens':>12} {'same count':>11} {'Jaccard':>8}  first difference")
    for (name, ratio), results in found.items():
        heads = sum(r.heads for r in results)
        same = sum(r.same_sets for r in results) / heads
        counts = sum(r.same_counts for r in results) / heads
        jac = sum(r.jaccard * r.heads for r in results) / heads
        first = next((r.first_difference for r in results if r.first_difference), None)
        rows.append({"method": name, "ratio": ratio, "heads": heads, "same_tokens": same, "same_count": counts,
                     "jaccard": jac, "first_difference": first})
        print(f"{name:<15} {ratio:>5} {same:>12.3f} {counts:>11.3f} {jac:>8.4f}  {first}")
    if args.out:
        args.out.write_text(json.dumps({"prompts": args.prompts, "ratios": args.ratios, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
