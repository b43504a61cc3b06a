"""Decode speed of N settings of one prompt: batched (one forward per step for all) against one at a time.

Usage::

    python benchmarks/bench_batched_decode.py [--model smollm2-135m] [--tokens 2000] [--settings 1 6 28 64]
        [--new 32] [--repeats 2] [--threads N]

One recorded prefill of a ~``--tokens`` haystack prompt (``record_prefill``); then, for each N, the N
settings (SnapKV at N capacities spread between 64 and the prompt, append-only, so they share one batch)
are decoded ``--new`` tokens each by :func:`headprobe.runtime.settings_batch.generate_settings` with ``batched=False``
(each setting's own ``generate``, as before) and ``batched=True`` (the settings as the rows of one stacked
cache), alternately A B A B. Tokens per second count the tokens the settings generated after the first
(which comes from the prefill), up to their end of sequence; a batch runs until its last row ends. Prints
tokens per second of each way and the median ratio of the pairs; then, with the time of building the N
caches from the record measured on its own (the same work in both ways) taken out, the decode's tokens per
second; and checks that both ways give the same tokens.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import headprobe
from headprobe.runtime.settings_batch import CacheSetting, generate_settings
from headprobe.runtime.shared_prefill import record_prefill


def haystack_ids(lm, tokens: int) -> torch.Tensor:
    """A ~``tokens`` prompt from the shipped haystack with a question at the end."""
    text = headprobe.load_haystack().text
    ids = lm.tokenizer(text[: tokens * 8], add_special_tokens=False)["input_ids"][: tokens - 16]
    tail = lm.tokenizer("\n\nQuestion: What is the text about? Answer:", add_special_tokens=False)["input_ids"]
    return torch.tensor([ids + tail])


def settings_for(n: int, prompt: int) -> list[CacheSetting]:
    caps = [64 + round(i * (prompt - 64) / max(n, 1)) for i in range(n)]
    return [CacheSetting("snapkv", capacity=c) for c in caps]


def compress_seconds(lm, rec, settings, new: int) -> float:
    """Wall time of building every setting's cache from the record (the same in both ways)."""
    from headprobe.runtime.generate import new_cache

    start = time.perf_counter()
    for s in settings:
        new_cache(lm, s.policy, s.budget, s.ratio, s.capacity, s.policy_options, new,
                  rec.attention_mask).compress_prompt(rec.layers)
    return time.perf_counter() - start


def timed(lm, rec, settings, new: int, batched: bool) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    out = generate_settings(lm, rec, settings, max_new_tokens=new, batched=batched)
    seconds = time.perf_counter() - start
    pad = lm.tokenizer.pad_token_id
    return seconds, [[t for t in g.result.new_tokens[0].tolist() if t != pad] for g in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--settings", nargs="+", type=int, default=[1, 6, 28, 64])
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = headprobe.load_model(args.model)
    ids = haystack_ids(lm, args.tokens)
    rec = record_prefill(lm, input_ids=ids)
    print(f"# {args.model}, prompt {ids.shape[1]} tokens, at most {args.new} new tokens a setting, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print("| settings | tokens | caches built, s | one at a time tok/s | batched tok/s | ratio | decode only: one at "
          "a time tok/s | batched tok/s | ratio | same tokens |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in args.settings:
        settings = settings_for(n, ids.shape[1])
        alone_s, batch_s, same = [], [], True
        for _ in range(args.repeats):
            a, alone_tokens = timed(lm, rec, settings, args.new, batched=False)
            b, batch_tokens = timed(lm, rec, settings, args.new, batched=True)
            alone_s.append(a)
            batch_s.append(b)
            same &= alone_tokens == batch_tokens
        tokens = sum(max(len(t) - 1, 0) for t in batch_tokens)     # the first token comes from the prefill
        build = compress_seconds(lm, rec, settings, args.new)
        ratio = statistics.median(a / b for a, b in zip(alone_s, batch_s))
        alone, batch = statistics.median(alone_s), statistics.median(batch_s)
        print(f"| {n} | {tokens} | {build:.1f} | {tokens / alone:.1f} | {tokens / batch:.1f} | {ratio:.2f}x | "
              f"{tokens / (alone - build):.1f} | {tokens / (batch - build):.1f} | "
              f"{(alone - build) / (batch - build):.2f}x | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
