"""Fingerprint every prompt headprobe builds for a model, to show that a change left a prompt form byte-identical.

    python benchmarks/prompt_snapshot.py --model smollm2-135m --out before.json      # on the old code
    python benchmarks/prompt_snapshot.py --model smollm2-135m --out after.json       # on the new code
    python benchmarks/prompt_snapshot.py --compare before.json after.json            # exit 1 if any differs

The prompts: every shipped needle (retrieval and reasoning) at four lengths and four depths, the
needle-free haystack prompts the probes share, the bAbI-style and long-generation eval items, the
outside-dataset QA prompt (two rows, one cut to fit), and every layer-retention task prompt. Each prompt
is recorded as the SHA-256 of its rendered text and of its token ids, with its length, so ``--compare``
names the first prompts whose text or tokens differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

LENGTHS = (500, 1000, 2000, 4000)
DEPTHS = (0.0, 0.33, 0.5, 1.0)


def _digest(text: str, ids: list[int]) -> dict:
    return {"text": hashlib.sha256(text.encode()).hexdigest(),
            "ids": hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest(), "tokens": len(ids)}


def snapshot(model: str, chat_template: bool) -> dict[str, dict]:
    """Prompt name → ``{"text", "ids", "tokens"}`` for every prompt headprobe builds on ``model``."""
    import headprobe
    from headprobe.eval.datasets import QAExample, qa_prompt_ids
    from headprobe.haystack.context import build_context
    from headprobe.probes.retention import RetentionConfig, task_prompt_ids

    lm = headprobe.load_model(model)
    tok = lm.tokenizer
    hay = headprobe.load_haystack()
    out: dict[str, dict] = {}
    for kind in ("retrieval", "reasoning"):
        for needle in headprobe.load_needles(headprobe.shipped_needle_file(kind)):
            for length in LENGTHS:
                for depth in DEPTHS:
                    ctx = build_context(tok, hay, needle, length, depth, chat_template)
                    out[f"needle/{needle.id}/{length}/{depth:g}"] = _digest(ctx.text, ctx.input_ids)
    for length in LENGTHS:
        ctx = build_context(tok, hay, None, length, 0.0, chat_template)
        out[f"haystack/{length}"] = _digest(ctx.text, ctx.input_ids)
    items = (headprobe.items_from_babi(headprobe.generate_questions(8))
             + headprobe.items_from_longgen(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:2]))
    for item in items:
        for length in (1000, 2000):
            ctx = build_context(tok, hay, item.needle, length, 0.5, chat_template, question=item.question)
            out[f"item/{item.id}/{length}"] = _digest(ctx.text, ctx.input_ids)
    rows = [QAExample("short", "The lighthouse keeper kept a red notebook. " * 30, "What colour was the notebook?",
                      ("red",)),
            QAExample("cut", hay.text[:20000], "What does the text say about repair?", ("repair",))]
    for row in rows:
        ids = qa_prompt_ids(tok, row, 1500, chat_template)
        out[f"dataset/{row.id}"] = _digest(tok.decode(ids), ids)
    config = RetentionConfig(chat_template=chat_template)
    for group in headprobe.load_tasks().values():
        for sample in group:
            ids = task_prompt_ids(tok, sample, config)
            out[f"retention/{sample.id}"] = _digest(tok.decode(ids), ids)
    return out


def compare(before: Path, after: Path) -> int:
    a, b = (json.loads(p.read_text()) for p in (before, after))
    differ = [k for k in a if k in b and a[k] != b[k]]
    missing = sorted(set(a) ^ set(b))
    print(f"{len(a)} prompts before, {len(b)} after; {len(differ)} differ; {len(missing)} in one snapshot only")
    for k in differ[:10]:
        print(f"  differs: {k} ({a[k]['tokens']} -> {b[k]['tokens']} tokens)")
    for k in missing[:10]:
        print(f"  in one only: {k}")
    return 1 if differ or missing else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--no-chat-template", action="store_true")
    ap.add_argument("--out", help="write the snapshot here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two snapshots")
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(Path(args.compare[0]), Path(args.compare[1])))
    if not args.out:
        ap.error("give --out or --compare")
    snap = snapshot(args.model, not args.no_chat_template)
    Path(args.out).write_text(json.dumps(snap, indent=0, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(snap)} prompts")


if __name__ == "__main__":
    main()
