"""What llama.cpp itself answers under a layer split, beside what ``headprobe eval`` measured for the same split
on the same RULER prompts: the accuracy a user deploying the split gets, and how far headprobe's eval of it
predicts that.

    python benchmarks/llama_cpp_agreement.py ruler.json --dataset gemma_4k --model gemma3-270m \\
        --pair full=- --pair layer_window:w128.json=w128.llama_cpp.json

Each ``--pair SETTING=EXPORT`` names a setting of the eval result and the file ``headprobe export --to
llama.cpp`` wrote for the same split (``-``: the model's GGUF as it is). For every trial of that setting the
prompt's token ids are rebuilt exactly as the eval built them (its tokenizer, its prompt form) and given to
llama.cpp (llama-cpp-python: the model's GGUF, the export's metadata as ``kv_overrides``, ``swa_full`` off,
greedy decoding, the eval's tokens to generate), and the answer is scored with RULER's metric. The table gives
both scores, how often the two agree on a sample's score, and how often the two answers are the same text.
llama.cpp computes with the GGUF's quantized weights and a float16 cache, headprobe with the weights dequantized
to float32: the answers can differ where the two are close.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import headprobe as hp
from headprobe.eval.result import EvalResult
from headprobe.eval.ruler_data import load_ruler_dir
from headprobe.eval.ruler_task import RulerTask, ruler_score
from headprobe.models.loading import _gguf_path
from headprobe.models.registry import MODELS


def parse_pairs(specs: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for spec in specs:
        setting, sep, export = spec.rpartition("=")
        if not sep or not setting or not export:
            raise SystemExit(f"--pair {spec!r}: expected SETTING=EXPORT.json (or SETTING=-)")
        out.append((setting, None if export == "-" else export))
    return out


def overrides(export: str | None) -> dict:
    if export is None:
        return {}
    data = json.loads(Path(export).read_text())
    if data.get("engine") != "llama.cpp" or "gguf_metadata" not in data:
        raise SystemExit(f"{export}: not a llama.cpp export (headprobe export --to llama.cpp)")
    return dict(data["gguf_metadata"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", help="a headprobe eval result of RULER samples (--task ruler)")
    ap.add_argument("--dataset", required=True, help="the RULER folder the eval read (--dataset)")
    ap.add_argument("--model", required=True, help="the model the eval ran (a registered GGUF model)")
    ap.add_argument("--pair", action="append", required=True, help="SETTING=EXPORT.json, or SETTING=- for the "
                    "model's file as it is")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, help="the first LIMIT trials of each setting")
    args = ap.parse_args()
    import llama_cpp

    result = EvalResult.load(args.result)
    if result.task.get("kind") != "ruler":
        raise SystemExit(f"{args.result}: not a RULER result")
    cells = {c["setting"]: c for c in result.cells}
    lm = hp.load_model(args.model, device="cpu")
    chat = result.extra.get("prompt_format") == "chat"
    examples = {ex.id: ex for ex in load_ruler_dir(args.dataset)}
    task = RulerTask(record={}, max_new_tokens=result.task.get("max_new_tokens"))
    gguf = _gguf_path(MODELS[args.model])

    print("| setting | llama.cpp metadata | samples | headprobe eval | llama.cpp | same score | same answer |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for setting, export in parse_pairs(args.pair):
        if setting not in cells:
            raise SystemExit(f"--pair {setting}: not a setting of {args.result} ({', '.join(cells)})")
        trials = cells[setting]["trials"][:args.limit]
        prompts = [task.prompt_ids(lm.tokenizer, examples[t["item"]], 10**9, chat) for t in trials]
        new = [t["new_tokens"] for t in trials]
        llm = llama_cpp.Llama(str(gguf), n_ctx=max(len(p) + n for p, n in zip(prompts, new)),
                              kv_overrides=overrides(export) or None, swa_full=False, n_threads=args.threads,
                              verbose=False)
        same_score = same_text = ours = theirs = 0.0
        for t, ids, n in zip(trials, prompts, new):
            out = llm.create_completion(prompt=ids, max_tokens=n, temperature=0.0, top_k=1, repeat_penalty=1.0)
            text = out["choices"][0]["text"]
            score = ruler_score(examples[t["item"]], text)
            ours, theirs = ours + t["score"], theirs + score
            same_score += (t["score"] > 0.5) == (score > 0.5)
            same_text += text.strip() == t["response"].strip()
        k = len(trials)
        meta = ", ".join(f"{key}={v}" for key, v in overrides(export).items()) or "the file's own"
        print(f"| {setting} | {meta} | {k} | {100 * ours / k:.0f} | {100 * theirs / k:.0f} | "
              f"{same_score:.0f}/{k} | {same_text:.0f}/{k} |", flush=True)
        del llm


if __name__ == "__main__":
    main()
