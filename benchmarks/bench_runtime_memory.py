"""Runtime benchmark on CPU: real cache bytes and time per decoded token at 4K context.

Usage::

    python benchmarks/bench_runtime_memory.py [--tokens 3900] [--capacity 128] [--decode 32] [--threads 1]

Reports, for a ~4K-token SmolLM2 prompt:
- bytes of the compressed cache (SnapKV, uniform capacity and a HeadKV-shaped budget map) against the stock
  full cache measured on the same prompt, and against Σ budgets × bytes per token + the reserved decode room;
- time per decoded token (compressed vs the stock full cache, in the same run), from
  ``(t(1 + K new tokens) − t(1 new token)) / K``.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

import headprobe
from headprobe import BudgetMap, generate_compressed, load_model
from headprobe.models.cache_argument import with_cache

_WORDS = (["The farmer", "A young teacher", "The old captain", "My neighbour", "The baker", "The mayor"],
          ["walked to", "wrote about", "painted", "visited", "repaired", "described"],
          ["the harbour", "a small garden", "the northern bridge", "the village market", "a wooden boat"],
          ["before the rain started.", "on a cold afternoon.", "with great care.", "for the local newspaper."])


def haystack(tokenizer, tokens: int) -> str:
    rng = random.Random(0)
    out: list[str] = []
    while not (len(out) % 20 == 0 and out and len(tokenizer(" ".join(out))["input_ids"]) > tokens):
        out.append(" ".join(rng.choice(w) for w in _WORDS))
    out.insert(len(out) // 2, "The secret passcode for the vault is 4817-TULIP.")
    return " ".join(out) + "\n\nQuestion: What is the secret passcode for the vault? Answer:"


def headkv_shaped(identity, capacity: int, window: int = 8, beta: float = 1.5) -> BudgetMap:
    L, H = identity.num_layers, identity.num_kv_heads
    scores = torch.rand(L, H, generator=torch.Generator().manual_seed(1)) ** 3
    scores = scores / scores.sum()
    b = capacity - window
    budgets = (scores * (b // beta) * L * H + (b - b // beta)).round().long() + window
    shares = (budgets.double() / budgets.sum()).tolist()
    shares[-1][-1] += 1 - sum(map(sum, shares))
    return BudgetMap(model=identity, method={"allocator": "headkv-shaped", "capacity": capacity}, shares=shares,
                     budgets=budgets.tolist())


def stock_generate(lm, ids, new):
    from transformers import DynamicCache
    cache = DynamicCache(config=lm.model.config)
    t = time.perf_counter()
    lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **with_cache(lm.model, cache),
                      max_new_tokens=new, min_new_tokens=new, do_sample=False,
                      pad_token_id=lm.tokenizer.pad_token_id)
    elapsed = time.perf_counter() - t
    nbytes = sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
                 for layer in cache.layers)
    return elapsed, nbytes


def compressed_generate(lm, ids, new, **kw):
    t = time.perf_counter()
    res = generate_compressed(lm, input_ids=ids, max_new_tokens=new, min_new_tokens=new, **kw)
    return time.perf_counter() - t, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=3900)
    ap.add_argument("--capacity", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device="cpu")
    text = lm.tokenizer.apply_chat_template([{"role": "user", "content": haystack(lm.tokenizer, args.tokens)}],
                                            tokenize=False, add_generation_prompt=True)
    ids = lm.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    n = ids.shape[1]
    report: dict = {"prompt_tokens": n, "capacity": args.capacity, "decode_tokens": args.decode,
                    "threads": args.threads, "headprobe": headprobe.__version__}

    # Memory (one new token: the cache as prefill left it plus its reserved room).
    new = args.decode + 1
    _, full_bytes = stock_generate(lm, ids, 1)
    report["full_cache_bytes"] = full_bytes
    bm = headkv_shaped(lm.identity, args.capacity)
    for label, kw in (("snapkv_uniform", {"policy": "snapkv", "capacity": args.capacity}),
                      ("snapkv_headkv_map", {"policy": "snapkv", "budget": bm})):
        _, res = compressed_generate(lm, ids, 1, **kw)
        cache = res.cache
        store = cache.stores[0]
        kept = int(cache.kept_tokens().sum())
        budget_bytes = kept * store.bytes_per_token()
        _, res_room = compressed_generate(lm, ids, new, **kw)
        room_bytes = res_room.cache.memory_bytes()
        slots = kept + new * cache.num_layers * cache.num_kv_heads
        expected = slots * store.bytes_per_token()                          # K, V and the int32 position
        kv_only = slots * 2 * store.head_dim * store.element_size()     # K and V alone
        report[label] = {
            "kept_tokens": kept, "cache_bytes": cache.memory_bytes(),
            "vs_full": cache.memory_bytes() / full_bytes,
            "budget_bytes": budget_bytes, "cache_bytes_with_room": room_bytes,
            "budget_plus_room_bytes": expected, "over_budget_plus_room": room_bytes / expected - 1,
            "kv_budget_plus_room_bytes": kv_only, "over_kv_budget_plus_room": room_bytes / kv_only - 1,
            "kept_min_max": [int(cache.kept_tokens().min()), int(cache.kept_tokens().max())],
        }

    # Time per decoded token, same run.
    t1, _ = stock_generate(lm, ids, 1)
    tk, _ = stock_generate(lm, ids, new)
    report["full_cache_ms_per_token"] = 1000 * (tk - t1) / args.decode
    for label, kw in (("snapkv", {"policy": "snapkv", "capacity": args.capacity}),
                      ("full_policy", {"policy": "full"})):
        c1, _ = compressed_generate(lm, ids, 1, **kw)
        ck, _ = compressed_generate(lm, ids, new, **kw)
        report[f"{label}_ms_per_token"] = 1000 * (ck - c1) / args.decode
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
