"""headprobe's runtime against kvpress at equal kept tokens: real cache bytes and needle accuracy.

Usage::

    python benchmarks/bench_kvpress_vs_runtime.py --kvpress-python /tmp/kvp/bin/python \\
        [--capacities 64 128] [--lengths 1000 2000] [--depths 0.25 0.75] [--needle-ids r01 r02 r03 r04] \\
        [--out bench_kvpress.json]

Both sides read the same HeadKV budget map (allocated from the shipped SmolLM2 retrieval-reasoning profile
at each capacity, window 8, beta 1.2) and the same prompts (headprobe's haystack and retrieval needles,
chat template, question included), and generate greedily with ``model.generate``:

- headprobe: ``generate_compressed(..., policy="snapkv", budget=map)``: the cache holds the kept pairs only;
- kvpress: ``with BudgetMapPress(map)(model): model.generate(...)`` (headprobe.library_bridges.kvpress,
  kvpress' documented generate usage): each head keeps the same number of tokens, but kvpress masks the
  others in a full ``DynamicCache``.

kvpress pins transformers <5.3 and headprobe's runtime needs a newer transformers, so each side runs in
its own Python (this one for headprobe, ``--kvpress-python`` for kvpress) on one thread, one after the
other. The kept tokens of both sides are compared trial by trial and must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def trials(args, tokenizer):
    import headprobe
    from headprobe.haystack.context import build_context

    hay = headprobe.load_haystack()
    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), args.needle_ids)
    for needle in needles:
        for length in args.lengths:
            for depth in args.depths:
                ctx = build_context(tokenizer, hay, needle, length, depth, chat_template=True)
                yield needle, length, depth, ctx.input_ids


def budget_map(capacity: int):
    import headprobe
    from headprobe.paths import shipped_profiles_dir

    prof = headprobe.Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json")
    return headprobe.allocate("headkv", [prof], capacity=capacity, window=8, beta=1.2)


def run_side(args) -> None:
    import torch

    import headprobe
    from headprobe.eval.answer_scores import score_answer

    torch.set_num_threads(1)
    lm = headprobe.load_model("smollm2-135m")
    rows = []
    settings = [("full", None)] + [("map", c) for c in args.capacities]
    if args.side == "kvpress":
        from transformers import DynamicCache

        from headprobe.library_bridges.kvpress import BudgetMapPress
        from headprobe.models.cache_argument import with_cache
    for needle, length, depth, ids in trials(args, lm.tokenizer):
        input_ids = torch.tensor([ids])
        n = input_ids.shape[1]
        for name, capacity in settings:
            t0 = time.perf_counter()
            if args.side == "headprobe":
                if capacity is None:
                    res = headprobe.generate_compressed(lm, input_ids=input_ids, policy="full",
                                                        max_new_tokens=args.max_new_tokens)
                else:
                    res = headprobe.generate_compressed(lm, input_ids=input_ids, policy="snapkv",
                                                        budget=budget_map(capacity),
                                                        max_new_tokens=args.max_new_tokens)
                new = res.new_tokens[0]
                kept = int((res.cache.kept_tokens()[0] - (len(new) - 1)).sum())   # prompt pairs kept
                nbytes = res.cache.memory_bytes()
                text = res.texts[0]
            else:
                cache = DynamicCache()
                press = None if capacity is None else BudgetMapPress(budget_map(capacity))
                with torch.no_grad():
                    if press is None:
                        out = lm.model.generate(input_ids, **with_cache(lm.model, cache), do_sample=False,
                                                max_new_tokens=args.max_new_tokens)
                    else:
                        with press(lm.model):
                            out = lm.model.generate(input_ids, **with_cache(lm.model, cache), do_sample=False,
                                                    max_new_tokens=args.max_new_tokens)
                new = out[0, n:]
                heads = lm.identity.num_layers * lm.identity.num_kv_heads
                kept = n * heads if press is None else int(press.kept_tokens_.sum())
                nbytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
                text = lm.tokenizer.decode(new, skip_special_tokens=True)
            seconds = time.perf_counter() - t0
            score = score_answer(text, needle.answer, "rouge")
            rows.append({"side": args.side, "setting": name, "capacity": capacity, "needle": needle.id,
                         "length": length, "depth": depth, "prompt_tokens": n, "kept_tokens": kept,
                         "cache_bytes": nbytes, "new_tokens": len(new), "rouge": score,
                         "passed": score > 0.5, "seconds": seconds, "answer": text})
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


def summarize(rows: list[dict]) -> str:
    out = ["| side | setting | prompt pairs kept (all heads, mean) | cache MiB (mean) | needle accuracy | s / trial |",
           "|---|---|---|---|---|---|"]
    keys = []
    for r in rows:
        k = (r["side"], r["setting"], r["capacity"])
        if k not in keys:
            keys.append(k)
    for side, setting, capacity in keys:
        sel = [r for r in rows if (r["side"], r["setting"], r["capacity"]) == (side, setting, capacity)]
        label = "full cache" if setting == "full" else f"budget map, capacity {capacity}"
        kept = sum(r["kept_tokens"] for r in sel) / len(sel)
        mib = sum(r["cache_bytes"] for r in sel) / len(sel) / 2**20
        acc = sum(r["passed"] for r in sel) / len(sel)
        sec = sum(r["seconds"] for r in sel) / len(sel)
        out.append(f"| {side} | {label} | {kept:.0f} | {mib:.2f} | {acc:.2f} ({sum(r['passed'] for r in sel)}"
                   f"/{len(sel)}) | {sec:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=("headprobe", "kvpress"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--kvpress-python", default=None, help="python of an environment with headprobe[kvpress]")
    ap.add_argument("--capacities", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--lengths", nargs="+", type=int, default=[1000, 2000])
    ap.add_argument("--depths", nargs="+", type=float, default=[0.25, 0.75])
    ap.add_argument("--needle-ids", nargs="+", default=["r01", "r02", "r03", "r04"])
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--out", default="bench_kvpress.json")
    args = ap.parse_args()
    if args.side:
        run_side(args)
        return
    if not args.kvpress_python:
        ap.error("--kvpress-python is required (an environment with headprobe[kvpress] installed)")
    common = [a for a in sys.argv[1:] if not a.startswith("--kvpress-python") and a != args.kvpress_python]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "TRANSFORMERS_VERBOSITY": "error"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for side, python in (("headprobe", sys.executable), ("kvpress", args.kvpress_python)):
            part = Path(tmp) / f"{side}.json"
            cmd = [python, __file__, *common, "--side", side, "--out", str(part)]
            subprocess.run(cmd, check=True, env=env)
            rows += json.loads(part.read_text())
    mine = {(r["needle"], r["length"], r["depth"], r["capacity"]): r for r in rows if r["side"] == "headprobe"}
    for r in rows:
        if r["side"] == "kvpress" and r["capacity"] is not None:
            ours = mine[(r["needle"], r["length"], r["depth"], r["capacity"])]
            if ours["kept_tokens"] != r["kept_tokens"]:
                raise SystemExit(f"kept tokens differ: headprobe {ours['kept_tokens']} vs kvpress {r['kept_tokens']}")
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(summarize(rows))


if __name__ == "__main__":
    main()
