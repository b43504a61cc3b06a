"""Which prompt tokens a setting's cache keeps on RULER samples: the answer's, other numbers', the rest.

Usage::

    python benchmarks/ruler_kept_tokens.py --model gemma3-270m --dataset gemma_4k --task niah_multikey_2 \\
        --limit 4 --settings snapkv "snapkv[window=8]" --ratios 0.5 [--out kept.json]

For every sample (a folder RULER's prepare.py wrote, or ``headprobe eval --task ruler`` generated, read as
``--dataset`` reads it), setting and ratio, the prompt is prefilled under the setting's compressed cache as
``headprobe eval`` builds it, and the positions each compressed KV head holds are read back (sliding-window
layers, which keep their own window whatever the setting, are left out). Printed per setting and ratio, as
means over samples and compressed heads: the share of the gold answer's prompt tokens kept, the share of
heads that keep all of them, the share of digit tokens kept (the numbers of every needle and distractor)
and of every other token, and RULER's score of the answers. The gold tokens are those whose characters lie
inside the gold answer's last occurrence before the question.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def token_classes(tokenizer, text: str, special: bool, gold: str, question_at: int):
    """``(input_ids [1, tokens], gold [tokens] bool, digit [tokens] bool)`` of one prompt."""
    enc = tokenizer(text, add_special_tokens=special, return_tensors="pt", return_offsets_mapping=True)
    offsets = enc.offset_mapping[0].tolist()
    start = text.rfind(gold, 0, question_at)
    gold_mask = np.array([start >= 0 and a >= start and b <= start + len(gold) and b > a for a, b in offsets])
    digit = np.array([b > a and re.fullmatch(r"\s*\d+\s*", text[a:b]) is not None for a, b in offsets])
    return enc.input_ids, gold_mask, digit


def kept_masks(cache, tokens: int) -> list[np.ndarray]:
    """``[tokens]`` bool of every compressed KV head of batch row 0 (sliding layers left out)."""
    out = []
    for layer in cache.stores:
        if layer is None or layer.is_sliding:
            continue
        positions, valid = layer.padded_positions()
        for row, ok in zip(positions[: cache.num_kv_heads], valid[: cache.num_kv_heads]):
            kept = np.zeros(tokens, dtype=bool)
            held = row[ok].numpy()
            kept[held[held < tokens]] = True
            out.append(kept)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dataset", required=True, help="RULER's files (<length>/<task>/validation.jsonl)")
    ap.add_argument("--task", required=True)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--settings", nargs="+", default=["snapkv"])
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.5])
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import headprobe as hp
    from headprobe.eval.ruler_data import load_ruler_dir
    from headprobe.eval.ruler_task import ruler_prompt_text, ruler_score
    from headprobe.eval.runner import resolve_budget
    from headprobe.eval.settings import EvalSetting

    examples = load_ruler_dir(args.dataset, tasks=[args.task], limit=args.limit)
    lm = hp.load_model(args.model)
    rows = []
    for ratio in args.ratios:
        for spec in args.settings:
            per_sample = []
            for ex in examples:
                text, special = ruler_prompt_text(lm.tokenizer, ex)
                question_at = text.rfind(ex.question.strip()) if ex.question.strip() else -1
                ids, gold, digit = token_classes(lm.tokenizer, text, special, ex.outputs[0],
                                                 question_at if question_at >= 0 else len(text))
                tokens = ids.shape[1]
                setting = EvalSetting.parse(f"{spec}@{max(1, round(tokens * (1 - ratio)))}")
                res = hp.generate_compressed(lm, input_ids=ids, policy=setting.runtime_policy,
                                             budget=resolve_budget(lm, setting), max_new_tokens=args.max_new_tokens)
                heads = kept_masks(res.cache, tokens)
                per_sample.append({
                    "score": ruler_score(ex, res.texts[0]), "answer": res.texts[0].strip()[:24],
                    "gold_kept": float(np.mean([(k & gold).sum() / max(gold.sum(), 1) for k in heads])),
                    "gold_whole": float(np.mean([bool((k | ~gold).all()) for k in heads])),
                    "digits_kept": float(np.mean([(k & digit).sum() / max(digit.sum(), 1) for k in heads])),
                    "other_kept": float(np.mean([(k & ~digit).sum() / max((~digit).sum(), 1) for k in heads])),
                    "digit_share": float(digit.mean()), "tokens": tokens})
            mean = {k: float(np.mean([s[k] for s in per_sample]))
                    for k in ("score", "gold_kept", "gold_whole", "digits_kept", "other_kept", "digit_share")}
            rows.append({"setting": spec, "ratio": ratio, **mean, "samples": per_sample})
    print(f"{args.model}, {args.task}, {len(examples)} samples; means over samples and compressed KV heads")
    print("| setting | ratio | RULER score | gold tokens kept | heads keeping the whole gold | digit tokens kept | "
          "other tokens kept |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| `{r['setting']}` | {r['ratio']} | {100 * r['score']:.0f} | {100 * r['gold_kept']:.0f}% | "
              f"{100 * r['gold_whole']:.0f}% | {100 * r['digits_kept']:.0f}% | {100 * r['other_kept']:.0f}% |")
    print(f"digit tokens are {100 * rows[0]['digit_share']:.0f}% of the prompt")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "task": args.task, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
