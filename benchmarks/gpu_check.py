"""Everything the GPU must show, in one command (all sections: about 10 minutes on one H100, estimated).

    python benchmarks/gpu_check.py --out gpu-check              # a machine with CUDA and Triton
    python benchmarks/gpu_check.py --dry-run --out /tmp/check    # CPU: tiny shapes, Triton interpreted
    python benchmarks/gpu_check.py --out gpu-kernels --sections compaction ragged_decode decode_step
                                                                 # the kernels and a whole decode step alone

Sections (each records ``ok``, its figures and its seconds; a failing section records the error and the
others still run):

``copy_bandwidth``
    GB/s of one large ``torch.empty(...).copy_()`` (bytes read + written): the yardstick of the kernels.
``compaction``
    The Triton compaction kernel vs the PyTorch path at Mistral-7B's shapes (8 KV heads, head_dim 128,
    a 32K prompt) at kept budgets of 256 to 16K pairs a KV head, batch 1 and 8: written buffers identical,
    bytes moved, time per call (the host's launch included) and per GPU run (CUDA graph replay), GB/s and
    share of copy bandwidth of each.
``ragged_decode``
    The Triton decode kernel vs the PyTorch path over ragged heads of budgets 256 to 32K (32 query heads on
    8 KV heads), batch 1 and 8: largest difference, time per call and per GPU run, GB/s of K/V read and
    share of copy bandwidth, split-K used and launches a call.
``profile_forward``
    Fast-mode profiling (``headprobe.run_profile``) of a random-weight model with Mistral-7B's attention
    shapes (hidden 4096, 32 query heads, 8 KV heads, head_dim 128) at 32K: the CUDA prompt forward runs
    the prefix/suffix split (flash attention for bfloat16, memory-efficient attention for float32, both
    returning the log-sum-exp), scores are finite; seconds per trial and peak memory. The split is checked
    against one masked SDPA call at those shapes (largest difference, both dtypes) and timed against it.
``profile_modes``
    Fast vs reference profiling of that model at 8K on the same trials: time ratio, Spearman of the
    query-head scores, top-10 overlap.
``compressed_decode``
    ``headprobe.generate_compressed`` at a 32K prompt (``full`` and ``snapkv`` through the Triton kernels,
    ``snapkv`` through the PyTorch path) vs ``model.generate`` with SDPA over a full cache: prefill
    seconds, decode ms per token, cache bytes, peak memory, tokens agreeing with SDPA, and host-device
    synchronisations per decoded token (``torch.cuda.set_sync_debug_mode``; ``keepkv`` too).
``decode_step``
    A whole decode step of a random model with Mistral-7B's shapes and all 32 layers, at 8K and 32K prompts,
    batch 1 and 8: stock ``generate`` (SDPA over the full cache), headprobe's SnapKV at 2,048 tokens a KV
    head through the Triton kernels and through the PyTorch path; ms per token (median step), GB/s of what
    a step reads (weights and K/V), the share of the step the cache takes, cache bytes and peak memory.

Writes ``OUT/gpu_check.json`` (format ``headprobe-gpu-check``, version 1) after every section, and
``OUT/gpu_check.md`` (one table a section). The model is random (no download): shapes and speed only,
no quality. Timings are single runs after a warm-up; treat them as indicative.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "headprobe-gpu-check"
VERSION = 1
SECTIONS = ("copy_bandwidth", "compaction", "ragged_decode", "profile_forward", "profile_modes",
            "compressed_decode", "decode_step")


@dataclass
class Shapes:
    """Sizes of one check run (the full check on CUDA, or the CPU dry run)."""

    device: str
    dtype: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    intermediate: int
    max_context: int
    copy_mib: int
    compact_tokens: int
    decode_lengths: list[int]
    timing_reps: int
    profile_length: int
    profile_depths: list[float]
    modes_length: int
    modes_needles: int
    modes_depths: list[float]
    decode_prompt: int
    new_tokens: int
    capacity: int
    compact_cases: list[tuple[int, int]]
    decode_batches: list[int]
    step_layers: int
    step_prompts: list[int]
    step_batches: list[int]
    step_capacity: int
    step_new_tokens: int
    tokenizer_vocab: int = 2000
    extra: dict[str, Any] = field(default_factory=dict)


FULL = Shapes(device="cuda", dtype="bfloat16", hidden=4096, heads=32, kv_heads=8, head_dim=128, layers=4,
              intermediate=14336, max_context=32768, copy_mib=2048, compact_tokens=32768,
              decode_lengths=[256, 1024, 4096, 32768], timing_reps=50,
              profile_length=32768, profile_depths=[0.0, 0.5, 1.0], modes_length=8192,
              modes_needles=2, modes_depths=[0.0, 0.25, 0.5, 0.75, 1.0],
              decode_prompt=32768 - 64, new_tokens=64, capacity=2048,
              compact_cases=[(256, 1), (1024, 1), (4096, 1), (16384, 1), (256, 8), (4096, 8)],
              decode_batches=[1, 8], step_layers=32, step_prompts=[8192 - 64, 32768 - 64], step_batches=[1, 8],
              step_capacity=2048, step_new_tokens=32)
DRY = Shapes(device="cpu", dtype="float32", hidden=64, heads=4, kv_heads=2, head_dim=16, layers=2,
             intermediate=128, max_context=2048, copy_mib=32, compact_tokens=512,
             decode_lengths=[64, 300], timing_reps=2, profile_length=512, profile_depths=[0.0, 0.5, 1.0],
             modes_length=512, modes_needles=2, modes_depths=[0.0, 0.5, 1.0],
             decode_prompt=400, new_tokens=6, capacity=64, compact_cases=[(16, 1), (200, 1), (64, 2)],
             decode_batches=[1, 2], step_layers=2, step_prompts=[200, 400], step_batches=[1, 2],
             step_capacity=64, step_new_tokens=5, tokenizer_vocab=600)


# ---- small helpers ---------------------------------------------------------------------------------

def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device, reps: int, warmup: int = 1) -> float:
    """Mean seconds of ``fn`` over ``reps`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / reps


def graph_timed(fn: Callable[[], Any], device, launches: int = 10, reps: int = 20) -> tuple[float | None, str | None]:
    """GPU seconds of one call of ``fn`` without the host's launch cost, and why not when it cannot tell.

    ``launches`` calls are captured in one CUDA graph (after warm-up calls on a side stream, so that
    autotuning and allocation happen outside the capture), and the graph is replayed ``reps`` times between
    two CUDA events. A call that synchronises with the host (a boolean mask, ``.item()``) cannot be captured:
    the result is then ``(None, reason)``, as it is on the CPU.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None, "CUDA graphs need a CUDA device"
    try:
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                fn()
        graph.replay()
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize(dev)
        return start.elapsed_time(end) / 1e3 / (reps * launches), None
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured is a finding, not a failure
        why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        try:
            torch.cuda.synchronize(dev)
        except Exception as after:
            raise RuntimeError(f"the device failed after a CUDA graph capture failed ({why})") from after
        return None, why


def full_cache_bytes(model, tokens: int) -> int:
    """Bytes of transformers' full cache of ``model`` holding ``tokens`` tokens (all rows together):
    K and V, every layer and KV head, in the model's dtype."""
    c = model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * model.dtype.itemsize * tokens


def _reset_peak(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mib(device) -> float | None:
    import torch

    if torch.device(device).type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return None


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def _r(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


# ---- the model -------------------------------------------------------------------------------------

class Workbench:
    """What several sections share: the random model, its tokenizer, a long haystack, the copy bandwidth."""

    def __init__(self, shapes: Shapes, work_dir: Path) -> None:
        self.shapes = shapes
        self.work_dir = work_dir
        self.copy_gbps: float | None = None
        self._loaded = None
        self._haystack: Path | None = None

    def haystack(self) -> Path:
        """The shipped haystack repeated until long enough for the longest prompt."""
        import headprobe

        if self._haystack is None:
            text = headprobe.load_haystack(None).text
            self._haystack = self.work_dir / "haystack.txt"
            self._haystack.write_text("\n\n".join([text] * 4))
        return self._haystack

    def loaded(self):
        """A random MistralForCausalLM with the configured shapes and a small BPE tokenizer."""
        if self._loaded is None:
            self._loaded = self.build(self.shapes.layers)
        return self._loaded

    def build(self, layers: int):
        """A new random MistralForCausalLM with ``layers`` decoder layers, built in its own dtype (a 7B-shaped
        model is never held in float32)."""
        import torch
        from tokenizers import ByteLevelBPETokenizer
        from transformers import MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast

        import headprobe

        s = self.shapes
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator([headprobe.load_haystack(None).text], vocab_size=s.tokenizer_vocab,
                                min_frequency=1, special_tokens=["<s>", "</s>", "<pad>"], show_progress=False)
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                      pad_token="<pad>")
        config = MistralConfig(vocab_size=len(tok), hidden_size=s.hidden, intermediate_size=s.intermediate,
                               num_hidden_layers=layers, num_attention_heads=s.heads,
                               num_key_value_heads=s.kv_heads, head_dim=s.head_dim, sliding_window=None,
                               max_position_embeddings=s.max_context, bos_token_id=tok.bos_token_id,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(_dtype(s.dtype))
        try:
            with torch.device(s.device):
                model = MistralForCausalLM(config)
        finally:
            torch.set_default_dtype(default)
        model = model.to(_dtype(s.dtype)).eval()
        model.config._attn_implementation = "sdpa"
        identity = headprobe.ModelIdentity(
            name="random-mistral-7b-attention", source="random weights", architecture="mistral",
            num_layers=layers, num_query_heads=s.heads, num_kv_heads=s.kv_heads, head_dim=s.head_dim,
            layer_types=("full_attention",) * layers, max_context=s.max_context)
        return headprobe.LoadedModel(model=model, tokenizer=tok, identity=identity)


# ---- sections --------------------------------------------------------------------------------------

def section_copy_bandwidth(bench: Workbench) -> dict:
    import torch

    s = bench.shapes
    n = s.copy_mib * 2**20
    src = torch.empty(n, dtype=torch.uint8, device=s.device).fill_(1)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), s.device, reps=max(3, s.timing_reps // 5))
    bench.copy_gbps = 2 * n / seconds / 1e9
    return {"ok": bool(torch.equal(src, dst)), "bytes": n, "ms": _r(seconds * 1e3),
            "gb_per_s": _r(bench.copy_gbps)}


def _share(gbps: float, bench: Workbench) -> float | None:
    return _r(gbps / bench.copy_gbps, 3) if bench.copy_gbps else None


def _compact_case(bench: Workbench, budget: int, batch: int, g) -> dict:
    """Compaction of ``budget`` kept pairs in each of ``batch · kv_heads`` segments of a ``compact_tokens``
    prompt, the Triton kernel against the PyTorch path: written buffers, time per call and per GPU run."""
    import torch

    from headprobe.runtime.kernels.compact import compact_triton
    from headprobe.runtime.kernels.torch_ref import compact_torch

    s = bench.shapes
    dev, dtype = torch.device(s.device), _dtype(s.dtype)
    heads, n, d = s.kv_heads, s.compact_tokens, s.head_dim
    segments = batch * heads
    keys = torch.randn(batch, heads, n, d, device=dev, dtype=dtype, generator=g)
    values = torch.randn(batch, heads, n, d, device=dev, dtype=dtype, generator=g)
    positions = torch.arange(n, device=dev)[None].expand(batch, n).contiguous()
    count = torch.full((segments,), budget, device=dev, dtype=torch.int64)
    index = torch.argsort(torch.rand(segments, n, device=dev, generator=g), dim=1)[:, :budget].sort(1).values
    capacity = count + 64
    offsets = torch.cumsum(capacity, 0) - capacity
    rows = int(capacity.sum())

    def buffers():
        return (torch.zeros(rows, d, device=dev, dtype=dtype), torch.zeros(rows, d, device=dev, dtype=dtype),
                torch.full((rows,), -1, device=dev, dtype=torch.int32), torch.zeros_like(count))

    ref, fast = buffers(), buffers()
    compact_torch(keys, values, positions, index, count, offsets, *ref[:3])
    compact_triton(keys, values, positions, index, count, offsets, *fast)
    exact = all(bool(torch.equal(a, b)) for a, b in zip(ref[:3], fast[:3])) and bool(torch.equal(fast[3], count))

    def triton_call():
        compact_triton(keys, values, positions, index, count, offsets, *fast)

    t_fast = timed(triton_call, dev, s.timing_reps)
    t_ref = timed(lambda: compact_torch(keys, values, positions, index, count, offsets, *ref[:3]), dev,
                  s.timing_reps)
    t_gpu, why = graph_timed(triton_call, dev)
    kept = segments * budget
    moved = kept * (2 * d * keys.element_size() * 2 + 8 + 8 + 4)   # K,V read+write; index, position, row
    gbps = moved / t_fast / 1e9
    gpu_gbps = moved / t_gpu / 1e9 if t_gpu else None
    return {"budget": budget, "batch": batch, "segments": segments, "kept_pairs": kept, "bytes_moved": moved,
            "exact": exact, "triton_us": _r(t_fast * 1e6), "torch_us": _r(t_ref * 1e6),
            "speedup": _r(t_ref / t_fast, 3), "gb_per_s": _r(gbps), "share_of_copy": _share(gbps, bench),
            "gpu_us": _r(t_gpu * 1e6) if t_gpu else None, "gpu_gb_per_s": _r(gpu_gbps) if gpu_gbps else None,
            "gpu_share_of_copy": _share(gpu_gbps, bench) if gpu_gbps else None, "gpu_time": why or "CUDA graph"}


def section_compaction(bench: Workbench) -> dict:
    """The compaction kernel at each kept budget per KV head (``compact_cases``: budget, batch).

    ``triton_us`` is a call as the runtime makes it (the host's launch included); ``gpu_us`` the kernel alone
    (CUDA graph replay), the figure the bandwidth target is about. Bytes moved: each kept pair's K and V
    read and written, its index and position read and its position written.
    """
    import torch

    s = bench.shapes
    dev = torch.device(s.device)
    g = torch.Generator(device=dev).manual_seed(0)
    rows = [_compact_case(bench, budget, batch, g) for budget, batch in s.compact_cases]
    return {"ok": all(r["exact"] for r in rows), "exact": all(r["exact"] for r in rows), "kv_heads": s.kv_heads,
            "prompt_tokens": s.compact_tokens, "head_dim": s.head_dim, "dtype": s.dtype, "rows": rows}


def _decode_case(bench: Workbench, budget: int, votes: bool, window: int | None, g, batch: int = 1) -> dict:
    """One ragged decode step over ``batch · kv_heads`` segments of ``budget/2 .. budget`` pairs, both paths:
    time per call as the runtime makes it (the host's launch included) and per GPU run (CUDA graph replay)."""
    import torch

    from headprobe.runtime.kernels import launch, ragged_decode
    from headprobe.runtime.kernels.torch_ref import ragged_attention_torch

    s = bench.shapes
    dev, dtype = torch.device(s.device), _dtype(s.dtype)
    kv_heads, d = s.kv_heads, s.head_dim
    heads = batch * kv_heads                                   # segments
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    lengths = torch.randint(budget // 2, budget + 1, (heads,), device=dev, generator=g)
    capacity = lengths + 64
    offsets = torch.cumsum(capacity, 0) - capacity
    total = int(capacity.sum())
    keys = torch.randn(total, d, device=dev, dtype=dtype, generator=g)
    values = torch.randn(total, d, device=dev, dtype=dtype, generator=g)
    slot = torch.arange(int(capacity.max()), device=dev)
    used = slot[None, :] < capacity[:, None]
    positions = torch.zeros(total, dtype=torch.int32, device=dev)
    positions[(offsets[:, None] + slot[None, :])[used]] = slot[None, :].expand(heads, -1)[used].to(torch.int32)
    log_votes = torch.rand(total, device=dev, generator=g).log1p() if votes else None
    query = torch.randn(batch, s.heads, 1, d, device=dev, dtype=dtype, generator=g)
    qpos = torch.full((batch, 1), budget + 1, device=dev)
    scale = d ** -0.5
    max_len = int(lengths.max())
    width = torch.arange(max_len, device=dev)

    def torch_path():            # what the PyTorch path does: gather the padded view, then attend
        valid = width[None, :] < lengths[:, None]
        index = torch.where(valid, offsets[:, None] + width[None, :], torch.zeros_like(offsets)[:, None])
        return ragged_attention_torch(query, keys[index], values[index], positions[index].long(), valid, qpos,
                                      scale, window, None, log_votes[index] if votes else None)

    def triton_path():
        return ragged_decode.ragged_decode_triton(query, keys, values, positions, offsets, lengths, kv_heads, qpos,
                                                  scale, window, log_votes, max_len=max_len)

    ref, fast = torch_path(), triton_path()
    diff = float((ref.float() - fast.float()).abs().max())
    close = bool(torch.allclose(ref.float(), fast.float(), atol=tol, rtol=tol))
    t_fast = timed(triton_path, dev, s.timing_reps)
    t_ref = timed(torch_path, dev, s.timing_reps)
    gpu_fast, why_fast = graph_timed(triton_path, dev)
    gpu_ref, why_ref = graph_timed(torch_path, dev)
    stored = int(lengths.sum())
    read = stored * (2 * d * keys.element_size() + 4 + (4 if votes else 0))
    gbps = read / t_fast / 1e9
    gpu_gbps = read / gpu_fast / 1e9 if gpu_fast else None
    splits = -(-max_len // ragged_decode.choose_split(max_len, heads, launch.sm_count(dev)))
    best = getattr(ragged_decode.DECODE_KERNEL.kernel(), "best_config", None)
    return {"budget": budget, "batch": batch, "votes": votes, "window": window, "stored_pairs": stored,
            "bytes_read": read, "max_abs_diff": _r(diff),
            "tolerance": tol, "close": close, "triton_us": _r(t_fast * 1e6), "torch_us": _r(t_ref * 1e6),
            "speedup": _r(t_ref / t_fast, 3), "gb_per_s": _r(gbps), "share_of_copy": _share(gbps, bench),
            "gpu_us": _r(gpu_fast * 1e6) if gpu_fast else None,
            "torch_gpu_us": _r(gpu_ref * 1e6) if gpu_ref else None,
            "gpu_speedup": _r(gpu_ref / gpu_fast, 3) if gpu_fast and gpu_ref else None,
            "gpu_gb_per_s": _r(gpu_gbps) if gpu_gbps else None,
            "gpu_share_of_copy": _share(gpu_gbps, bench) if gpu_gbps else None,
            "gpu_time": "; ".join(w for w in (why_fast, why_ref and f"torch path: {why_ref}") if w) or "CUDA graph",
            "splits_per_head": splits, "programs": heads * splits, "launches": 1 if splits == 1 else 2,
            "config": str(best) if best is not None else "first configuration (interpreter or untuned)"}


def section_ragged_decode(bench: Workbench) -> dict:
    import torch

    from headprobe.runtime.kernels import launch

    s = bench.shapes
    dev = torch.device(s.device)
    g = torch.Generator(device=dev).manual_seed(1)
    cases = [(length, False, None, batch) for batch in s.decode_batches for length in s.decode_lengths]
    cases.append((s.decode_lengths[len(s.decode_lengths) // 2], True, None, 1))            # KeepKV vote bias
    cases.append((s.decode_lengths[-1], False, s.decode_lengths[-1] // 4, 1))              # sliding window
    rows = [_decode_case(bench, budget, votes, window, g, batch) for budget, votes, window, batch in cases]
    return {"ok": all(r["close"] for r in rows), "kv_heads": s.kv_heads, "query_heads": s.heads,
            "head_dim": s.head_dim, "dtype": s.dtype, "sm_count": launch.sm_count(dev), "rows": rows}


def _profile_request(bench: Workbench, out_dir: Path, mode: str, length: int, needles: list[str],
                     depths: list[float], batch_size: int):
    import headprobe

    return headprobe.ProfileRequest(
        probes=["retrieval_reasoning"], lengths=[length], depths=depths, out_dir=out_dir, mode=mode,
        needle_ids=needles, haystack=str(bench.haystack()), chat_template=False, batch_size=batch_size,
        gate="likelihood", max_new_tokens=8, force=True)


def passing_needles(tokenizer, count: int) -> list[str]:
    """Reasoning needles whose correct candidate has the fewest tokens relative to the distractor.

    A random model's next-token distribution is close to uniform, so its likelihood gate passes the
    candidate with fewer tokens: these needles give trials that pass in both modes, hence profiles to
    compare.
    """
    import headprobe

    needles = headprobe.load_needles(headprobe.shipped_needle_file("reasoning"))

    def tokens(text: str) -> int:
        return len(tokenizer(" " + text, add_special_tokens=False)["input_ids"])

    ranked = sorted(needles, key=lambda n: (tokens(n.answer) - tokens(n.distractor), n.id))
    return [n.id for n in ranked[:count]]


def _passed(records: list[dict]) -> int:
    return sum(bool(r["gates"].get("likelihood")) for r in records)


def _finite_scores(records: list[dict]) -> bool:
    return all(math.isfinite(x) for r in records for rows in r["scores"].values() for row in rows for x in row)


def _split_vs_masked(bench: Workbench, dtype) -> dict:
    """The prefix/suffix split of a prompt forward against one masked SDPA call, at the model's shapes."""
    import torch
    import torch.nn.functional as F

    from headprobe.attention.prefix_split import prefix_split_attention

    s = bench.shapes
    dev = torch.device(s.device)
    g = torch.Generator(device=dev).manual_seed(3)
    block = max(16, s.profile_length // 8)
    prefix = s.profile_length - block
    query = torch.randn(1, s.heads, block, s.head_dim, device=dev, dtype=dtype, generator=g)
    key = torch.randn(1, s.kv_heads, prefix + block, s.head_dim, device=dev, dtype=dtype, generator=g)
    value = torch.randn(1, s.kv_heads, prefix + block, s.head_dim, device=dev, dtype=dtype, generator=g)
    scale = s.head_dim ** -0.5
    group = s.heads // s.kv_heads
    visible = torch.arange(prefix + block, device=dev)[None, :] <= prefix + torch.arange(block, device=dev)[:, None]

    def split():
        return prefix_split_attention(query, key, value, prefix, scale)

    def masked():
        return F.scaled_dot_product_attention(query, key.repeat_interleave(group, 1), value.repeat_interleave(group, 1),
                                              attn_mask=visible, scale=scale).transpose(1, 2)

    diff = float((split().float() - masked().float()).abs().max())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    reps = max(2, s.timing_reps // 10)
    t_split, t_masked = timed(split, dev, reps), timed(masked, dev, reps)
    return {"dtype": str(dtype).replace("torch.", ""), "prefix": prefix, "block": block, "max_abs_diff": _r(diff),
            "tolerance": tol, "close": diff <= tol, "split_ms": _r(t_split * 1e3), "masked_ms": _r(t_masked * 1e3),
            "speedup": _r(t_masked / t_split, 3)}


def section_profile_forward(bench: Workbench) -> dict:
    from unittest import mock

    import torch

    import headprobe
    from headprobe.attention import prefix_split, recorder

    s = bench.shapes
    loaded = bench.loaded()
    out = bench.work_dir / "profile_forward"
    request = _profile_request(bench, out, "fast", s.profile_length, passing_needles(loaded.tokenizer, 1),
                               s.profile_depths,
                               batch_size=len(s.profile_depths))
    _reset_peak(s.device)
    start = time.perf_counter()
    with mock.patch.object(recorder, "prefix_split_attention", wraps=prefix_split.prefix_split_attention) as spy:
        result = headprobe.run_profile(loaded, request)
    _sync(s.device)
    seconds = time.perf_counter() - start
    peak = _peak_mib(s.device)
    _, records = headprobe.read_log(result.logs[0])
    finite = _finite_scores(records)
    exactness = [_split_vs_masked(bench, dtype) for dtype in dict.fromkeys([_dtype(s.dtype), torch.float32])]
    ok = (result.trials_run == len(s.profile_depths) and len(records) == result.trials_run and finite
          and spy.call_count > 0 and all(row["close"] for row in exactness))
    return {"ok": ok, "length": s.profile_length, "trials": result.trials_run,
            "passed_likelihood_gate": _passed(records), "scores_finite": finite,
            "prompt_tokens": max(r["prompt_tokens"] for r in records) if records else None,
            "seconds_per_trial": _r(seconds / max(1, result.trials_run)), "peak_mib": peak,
            "split_attention_calls": spy.call_count, "device": str(loaded.device), "split_vs_masked": exactness}


def section_profile_modes(bench: Workbench) -> dict:
    import numpy as np
    from scipy.stats import spearmanr

    import headprobe

    s = bench.shapes
    loaded = bench.loaded()
    needles = passing_needles(loaded.tokenizer, s.modes_needles)
    figures: dict[str, Any] = {"length": s.modes_length, "needles": needles, "depths": s.modes_depths}
    maps = {}
    for mode in ("reference", "fast"):
        out = bench.work_dir / f"profile_{mode}"
        request = _profile_request(bench, out, mode, s.modes_length, needles, s.modes_depths,
                                   batch_size=len(s.modes_depths))
        start = time.perf_counter()
        result = headprobe.run_profile(loaded, request)
        _sync(s.device)
        seconds = time.perf_counter() - start
        _, records = headprobe.read_log(result.logs[0])
        figures[mode] = {"trials": result.trials_run, "passed_likelihood_gate": _passed(records),
                         "seconds_per_trial": _r(seconds / max(1, result.trials_run)),
                         "failures": result.failures}
        profile = out / f"{headprobe.frontend.model_slug(loaded.identity.name)}.retrieval_reasoning.json"
        if profile.exists():
            maps[mode] = np.array(headprobe.Profile.load(profile).query_heads, dtype=float).ravel()
    figures["speedup"] = _r(figures["reference"]["seconds_per_trial"] / figures["fast"]["seconds_per_trial"], 3)
    if len(maps) == 2:
        rho = float(spearmanr(maps["fast"], maps["reference"])[0])
        figures["spearman"] = _r(rho, 4) if math.isfinite(rho) else None
        top = [set(np.argsort(-maps[m], kind="stable")[:10].tolist()) for m in ("fast", "reference")]
        figures["top10_overlap"] = len(top[0] & top[1])
    figures["ok"] = len(maps) == 2 and figures["spearman"] is not None and figures["spearman"] >= 0.95
    return figures


def section_compressed_decode(bench: Workbench) -> dict:
    import torch

    import headprobe
    from headprobe.runtime.kernels import dispatch

    s = bench.shapes
    loaded = bench.loaded()
    model, tok = loaded.model, loaded.tokenizer
    dev = loaded.device
    g = torch.Generator(device=dev).manual_seed(2)
    low = max(tok.all_special_ids) + 1
    prompt = torch.randint(low, len(tok), (1, s.decode_prompt), device=dev, generator=g)
    n = s.new_tokens
    common = {"do_sample": False, "min_new_tokens": n, "pad_token_id": tok.pad_token_id}

    def sdpa(new: int, ids=prompt):
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             **{**common, "min_new_tokens": new})
        return out[:, ids.shape[1]:], None

    def compressed(policy: str, backend: str):
        def run(new: int, ids=prompt):
            previous = headprobe.set_kernel_backend(backend)
            try:
                res = headprobe.generate_compressed(loaded, input_ids=ids, attention_mask=torch.ones_like(ids),
                                                    policy=policy, capacity=s.capacity, max_new_tokens=new,
                                                    **{**common, "min_new_tokens": new})
            finally:
                headprobe.set_kernel_backend(previous)
            return res.new_tokens, res
        return run

    # Triton on CUDA; on the CPU dry run "triton" forces the interpreted kernels.
    fast_backend = "auto" if dev.type == "cuda" else "triton"
    runs = {"sdpa_full_cache": sdpa, "full_triton": compressed("full", fast_backend),
            "snapkv_triton": compressed("snapkv", fast_backend), "snapkv_torch": compressed("snapkv", "torch")}
    warm = prompt[:, : min(2048, s.decode_prompt)]
    for run in runs.values():                      # compile, autotune, allocate once before timing
        run(4, warm)
    results: dict[str, Any] = {}
    tokens = {}
    for name, run in runs.items():
        _sync(dev)
        start = time.perf_counter()
        run(1)
        _sync(dev)
        prefill = time.perf_counter() - start
        _reset_peak(dev)
        start = time.perf_counter()
        new, res = run(n)
        _sync(dev)
        total = time.perf_counter() - start
        tokens[name] = new[0].tolist()
        cache_bytes = res.memory_bytes if res is not None else full_cache_bytes(model, s.decode_prompt + n)
        results[name] = {"prefill_s": _r(prefill), "total_s": _r(total),
                         "decode_ms_per_token": _r(max(total - prefill, 0.0) / max(1, n - 1) * 1e3),
                         "new_tokens": len(tokens[name]), "cache_bytes": int(cache_bytes),
                         "peak_mib": _peak_mib(dev)}
    syncs = {name: _syncs_per_token(runs[name], warm, dev) for name in runs}
    syncs["keepkv_triton"] = _syncs_per_token(compressed("keepkv", fast_backend), warm, dev)
    for name, count in syncs.items():
        if name in results:
            results[name]["syncs_per_token"] = count
    ref = tokens["sdpa_full_cache"]
    for name in runs:
        same = 0
        for a, b in zip(tokens[name], ref):
            if a != b:
                break
            same += 1
        results[name]["leading_tokens_equal_to_sdpa"] = same
    full_bytes = results["sdpa_full_cache"]["cache_bytes"]
    ok = (all(r["new_tokens"] == n for r in results.values()) and dispatch.launch_failure() is None
          and results["snapkv_triton"]["cache_bytes"] < full_bytes
          and results["full_triton"]["leading_tokens_equal_to_sdpa"] >= 1)
    speed = results["sdpa_full_cache"]["decode_ms_per_token"]
    for r in results.values():
        r["decode_speedup_vs_sdpa"] = _r(speed / r["decode_ms_per_token"], 3) if r["decode_ms_per_token"] else None
    return {"ok": ok, "prompt_tokens": s.decode_prompt, "new_tokens": n, "capacity": s.capacity,
            "launch_failure": dispatch.launch_failure(), "keepkv_syncs_per_token": syncs["keepkv_triton"],
            "layers": s.layers, "runs": results}


def _step_clock(device):
    """A stopping criterion that never stops: it records the time (device synchronised) as each token is
    chosen in ``marks``, so one ``generate`` call gives its prefill (the first mark) and every decode step."""
    import torch
    from transformers import StoppingCriteria

    class StepClock(StoppingCriteria):
        def __init__(self) -> None:
            self.marks: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            _sync(device)
            self.marks.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StepClock()


def _step_run(model, loaded, ids, new: int, policy: str | None, backend: str, capacity: int) -> dict:
    """One ``generate`` of ``new`` tokens: stock (``policy`` None: SDPA over transformers' full cache) or
    headprobe's compressed cache; prefill seconds, median decode step, cache bytes (allocated) and the K/V
    bytes a step reads (stored pairs), peak memory."""
    import statistics

    import torch
    from transformers import StoppingCriteriaList

    import headprobe

    dev = ids.device
    clock = _step_clock(dev)
    common = {"do_sample": False, "min_new_tokens": new, "max_new_tokens": new,
              "pad_token_id": loaded.tokenizer.pad_token_id, "stopping_criteria": StoppingCriteriaList([clock])}
    _reset_peak(dev)
    _sync(dev)
    start = time.perf_counter()
    if policy is None:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **common)
        cache_bytes = read_bytes = full_cache_bytes(model, ids.numel())
    else:
        previous = headprobe.set_kernel_backend(backend)
        try:
            res = headprobe.generate_compressed(loaded, input_ids=ids, attention_mask=torch.ones_like(ids),
                                                policy=policy, capacity=capacity, **common)
        finally:
            headprobe.set_kernel_backend(previous)
        cache_bytes, read_bytes = res.memory_bytes, res.cache.used_bytes()
    steps = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    return {"prefill_s": _r(clock.marks[0] - start), "decode_ms_per_token": _r(statistics.median(steps) * 1e3),
            "steps": len(steps), "cache_bytes": int(cache_bytes), "kv_bytes_read": int(read_bytes),
            "peak_mib": _peak_mib(dev)}


def section_decode_step(bench: Workbench) -> dict:
    """A whole decode step of a 7B-shaped model (``step_layers`` layers, random weights) at each prompt length
    and batch: stock ``generate`` (SDPA over the full cache), headprobe's SnapKV at ``step_capacity`` through
    the Triton kernels and through the PyTorch path.

    ``gb_per_s`` is what one step must read (the weights once, and every stored K/V pair) over its time.
    ``cache_share`` is ``1 - floor / step``, the part of the step the cache's size costs, where ``floor`` is
    the same run's step at the same batch over a 64-token prompt (capacity 16 for headprobe's runs): a
    cache that costs almost nothing. A run that does not fit the GPU's memory is recorded as
    ``out of memory`` and the others go on.
    """
    import gc

    import torch

    s = bench.shapes
    loaded = bench.build(s.step_layers)
    model, dev = loaded.model, loaded.device
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    fast = "auto" if dev.type == "cuda" else "triton"
    kinds = {"sdpa_full_cache": (None, "torch", 0), "snapkv_triton": ("snapkv", fast, s.step_capacity),
             "snapkv_torch": ("snapkv", "torch", s.step_capacity)}
    low = max(loaded.tokenizer.all_special_ids) + 1
    g = torch.Generator(device=dev).manual_seed(3)
    warm = torch.randint(low, len(loaded.tokenizer), (1, min(1024, s.step_prompts[0])), device=dev, generator=g)
    for policy, backend, capacity in kinds.values():          # compile, autotune and allocate before timing
        _step_run(model, loaded, warm, 3, policy, backend, min(capacity, 256) or 0)
    floors = {}
    for batch in s.step_batches:
        short = torch.randint(low, len(loaded.tokenizer), (batch, 64), device=dev, generator=g)
        for name, (policy, backend, capacity) in kinds.items():
            floors[batch, name] = _step_run(model, loaded, short, s.step_new_tokens, policy, backend,
                                            min(capacity, 16))["decode_ms_per_token"]
    rows = []
    for prompt in s.step_prompts:
        for batch in s.step_batches:
            ids = torch.randint(low, len(loaded.tokenizer), (batch, prompt), device=dev, generator=g)
            row: dict[str, Any] = {"prompt": prompt, "batch": batch}
            for name, (policy, backend, capacity) in kinds.items():
                try:
                    r = _step_run(model, loaded, ids, s.step_new_tokens, policy, backend, capacity)
                except torch.OutOfMemoryError:
                    r = {"decode_ms_per_token": None, "error": "out of memory"}
                gc.collect()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                ms = r["decode_ms_per_token"]
                if ms:
                    r["gb_per_s"] = _r((weight_bytes + r["kv_bytes_read"]) / (ms / 1e3) / 1e9)
                    r["share_of_copy"] = _share(r["gb_per_s"], bench)
                if ms:
                    r["floor_ms_per_token"] = floors[batch, name]
                    r["cache_share"] = _r(max(0.0, 1 - floors[batch, name] / ms), 3)
                row[name] = r
            sdpa = row["sdpa_full_cache"]["decode_ms_per_token"]
            for name in ("snapkv_triton", "snapkv_torch"):
                ms = row[name]["decode_ms_per_token"]
                row[name]["speedup_vs_sdpa"] = _r(sdpa / ms, 3) if ms and sdpa else None
            torch_ms, triton_ms = (row[n]["decode_ms_per_token"] for n in ("snapkv_torch", "snapkv_triton"))
            row["snapkv_triton"]["speedup_vs_torch_path"] = _r(torch_ms / triton_ms, 3) if torch_ms and triton_ms else None
            rows.append(row)
    del loaded, model
    gc.collect()
    flat = [{"prompt": r["prompt"], "batch": r["batch"], "run": name, **r[name]}
            for r in rows for name in kinds]
    ok = all(f.get("steps") == s.step_new_tokens - 1 for f in flat if "error" not in f) \
        and all("error" not in r["snapkv_triton"] for r in rows)
    return {"ok": ok, "layers": s.step_layers, "capacity": s.step_capacity, "new_tokens": s.step_new_tokens,
            "weight_bytes": weight_bytes, "rows": flat}


def _syncs_per_token(run: Callable, ids, device) -> float | None:
    """Host-device synchronisations per decoded token (CUDA's sync debug mode counts them; ``None`` on CPU):
    ``(syncs(10 new) - syncs(2 new)) / 8``, so the prefill's own cancel out."""
    import warnings

    import torch

    if torch.device(device).type != "cuda":
        return None
    counts = []
    for new in (2, 10):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run(new, ids)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    return _r((counts[1] - counts[0]) / 8, 3)


SECTION_FUNCS = {"copy_bandwidth": section_copy_bandwidth, "compaction": section_compaction,
                 "ragged_decode": section_ragged_decode, "profile_forward": section_profile_forward,
                 "profile_modes": section_profile_modes, "compressed_decode": section_compressed_decode,
                 "decode_step": section_decode_step}


# ---- report ----------------------------------------------------------------------------------------

def _flat(prefix: str, obj: Any, out: dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            _flat(f"{prefix}.{key}" if prefix else key, value, out)
    elif not isinstance(obj, list) or not obj or not isinstance(obj[0], dict):
        out[prefix] = obj


def markdown(report: dict) -> str:
    machine = report["machine"]
    versions = (f"torch {machine['torch']}, triton {machine['triton']}, "
                f"transformers {machine['transformers']}")
    lines = [f"# GPU check ({'dry run, ' if report['dry_run'] else ''}{machine['device_name']})", "",
             f"{report['date']}; {versions}; command `{report['command']}`", ""]
    for name, sec in report["sections"].items():
        lines += [f"## {name}: {'ok' if sec.get('ok') else 'FAILED'} ({sec.get('seconds', 0):.1f} s)", ""]
        if sec.get("error"):
            lines += ["```", sec["error"].strip(), "```", ""]
        tables = {k: v for k, v in sec.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
        scalars: dict[str, Any] = {}
        _flat("", {k: v for k, v in sec.items() if k not in tables and k not in ("ok", "seconds", "error")},
              scalars)
        if scalars:
            lines += ["| figure | value |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in scalars.items()] + [""]
        for rows in tables.values():
            keys = list(dict.fromkeys(k for r in rows for k in r))     # every row's figures, first-seen order
            lines += ["| " + " | ".join(keys) + " |", "|" + "---:|" * len(keys)]
            lines += ["| " + " | ".join(str(r.get(k)) for k in keys) + " |" for r in rows] + [""]
    return "\n".join(lines) + "\n"


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _machine(shapes: Shapes) -> dict:
    import torch
    import transformers

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = shapes.device == "cuda"
    return {"device_name": torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})",
            "torch": torch.__version__, "triton": triton_version, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, tiny shapes, Triton under its interpreter (checks this script)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--layers", type=int, help="decoder layers of the random model (default 4)")
    parser.add_argument("--force", action="store_true", help="replace existing result files")
    args = parser.parse_args(argv)
    if args.dry_run:
        # Before anything imports Triton: it decorates its own helpers at import.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import headprobe

    shapes = DRY if args.dry_run else FULL
    if args.layers:
        shapes.layers = args.layers
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run with --dry-run to check the script on CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        json_path = headprobe.frontend.check_overwrite(out / "gpu_check.json", args.force)
        md_path = headprobe.frontend.check_overwrite(out / "gpu_check.md", args.force)
    except headprobe.HeadprobeError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        torch.set_num_threads(1)
    report = {"format": FORMAT, "version": VERSION, "dry_run": args.dry_run,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python", "benchmarks/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
              "machine": _machine(shapes), "shapes": asdict(shapes), "sections": {}}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        bench = Workbench(shapes, Path(tmp))
        if "copy_bandwidth" not in args.sections:
            args.sections.insert(0, "copy_bandwidth")        # the yardstick of the GB/s shares
        for name in [s for s in SECTIONS if s in args.sections]:
            print(f"gpu_check: {name} ...", flush=True)
            start = time.perf_counter()
            try:
                result = SECTION_FUNCS[name](bench)
            except Exception:  # noqa: BLE001 - one failing section must not lose the others
                result = {"ok": False, "error": traceback.format_exc()[-3000:]}
            result["seconds"] = round(time.perf_counter() - start, 2)
            report["sections"][name] = result
            report["total_seconds"] = round(time.perf_counter() - started, 2)
            headprobe.frontend.atomic_write_json(json_path, report)
            _write_text(md_path, markdown(report))
            print(f"gpu_check: {name} {'ok' if result.get('ok') else 'FAILED'} in {result['seconds']:.1f} s",
                  flush=True)
    failed = [n for n, sec in report["sections"].items() if not sec.get("ok")]
    print(f"gpu_check: wrote {json_path} and {md_path}; {report['total_seconds']:.0f} s; "
          + (f"FAILED: {', '.join(failed)}" if failed else "all sections ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
