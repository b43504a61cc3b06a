"""GPU runtime benchmark: Triton kernels vs the PyTorch path (skips cleanly without CUDA).

Usage::

    python benchmarks/bench_runtime_gpu.py [--segments 96] [--length 4096] [--group 4]

Times one ragged decode attention step over ``segments`` KV heads of ragged lengths up to ``length`` with
both backends, and one compaction launch, and checks they agree.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=96)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_runtime_gpu: no CUDA device; skipped")
        return 0
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench_runtime_gpu: Triton is not installed; skipped")
        return 0
    from headprobe.runtime.kernels import dispatch
    from headprobe.runtime.kernels.ragged_decode import ragged_decode_triton
    from headprobe.runtime.store import LayerStore, Selection

    dev = torch.device("cuda")
    batch, heads = 1, args.segments
    n, d = args.length, args.head_dim
    keys = torch.randn(batch, heads, n, d, device=dev, dtype=torch.bfloat16)
    values = torch.randn_like(keys)
    positions = torch.arange(n, device=dev)[None]
    count = torch.randint(n // 16, n, (heads,), device=dev)
    index = torch.arange(n, device=dev)[None].repeat(heads, 1)
    store = LayerStore(batch, heads, d, count + 1, torch.bfloat16, dev)

    def timed(fn, reps=50):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps

    out = {}
    for backend in ("torch", "triton"):
        dispatch.set_backend(backend)
        out[f"compact_{backend}_ms"] = timed(lambda: store.write_selection(keys, values, positions,
                                                                           Selection(index, count)))
    query = torch.randn(batch, heads * args.group, 1, d, device=dev, dtype=torch.bfloat16)
    qpos = torch.full((batch, 1), n, device=dev)
    dispatch.set_backend("torch")
    ref = dispatch.ragged_attention(query, store, qpos, d ** -0.5)
    fast = ragged_decode_triton(query, store, qpos, d ** -0.5)
    out["max_abs_diff"] = float((ref.float() - fast.float()).abs().max())
    out["decode_torch_ms"] = timed(lambda: dispatch.ragged_attention(query, store, qpos, d ** -0.5))
    out["decode_triton_ms"] = timed(lambda: ragged_decode_triton(query, store, qpos, d ** -0.5))
    out["device"] = torch.cuda.get_device_name()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
