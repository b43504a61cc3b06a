"""GPU runtime benchmark: Triton kernels vs the PyTorch path; register use of the compiled decode kernel.

Usage::

    python benchmarks/bench_runtime_gpu.py [--segments 96] [--length 4096] [--group 4]
    python benchmarks/bench_runtime_gpu.py --resources [--arch 90]     # no GPU needed

The first form (CUDA) times one ragged decode attention step over ``segments`` KV heads of ragged
lengths up to ``length`` with both backends, and one compaction launch, and checks they agree
(``benchmarks/gpu_check.py`` runs the full set of GPU checks). ``--resources`` compiles every autotuning
configuration of the ragged decode kernel for ``sm_<arch>`` without a GPU (Triton's bundled ``ptxas``)
and prints registers per thread, spill stack and shared memory (Mistral-7B's decode shape: group 4,
head_dim 128, bfloat16).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch


def resources(arch: int, head_dim: int = 128, group: int = 4) -> list[dict]:
    """Registers, spill stack and shared memory of every decode-kernel configuration compiled for ``arch``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from headprobe.runtime.kernels import ragged_decode as rd

    fn = triton.jit(rd._ragged_decode_kernel)
    pointers = {"Q": "*bf16", "OK": "*bf16", "OV": "*bf16", "OP": "*i32", "VOTES": "*fp32", "OFF": "*i64",
                "LEN": "*i64", "QPOS": "*i64", "OUT": "*bf16", "M_OUT": "*fp32", "L_OUT": "*fp32",
                "ACC_OUT": "*fp32"}
    scalars = {"heads": "i32", "group": "i32", "split": "i32", "scaling": "fp32", "window": "i32"}
    signature = {**pointers, **scalars}
    names = fn.arg_names
    signature.update({n: "constexpr" for n in names if n not in signature})
    signature = {n: signature[n] for n in names}
    # What the launcher specialises for real tensors: 16-byte aligned pointers, split a multiple of 16.
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in [*pointers, "split"]}
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    rows = []
    for meta, warps, stages in rd.DECODE_KERNEL.configs:
        for votes in (False, True):
            constexprs = {"D": head_dim, "BLOCK_G": max(16, triton.next_power_of_2(group)), "BLOCK_D": head_dim,
                          "HAS_VOTES": votes, "HAS_WINDOW": False, "FINAL": False, "DOT_FP32": False, **meta}
            src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
            kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                    options={"num_warps": warps, "num_stages": stages})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
                fh.write(kernel.asm["cubin"])
                fh.flush()
                usage = subprocess.run([cuobjdump, "-res-usage", fh.name], capture_output=True, text=True,
                                       check=True).stdout
            found = re.search(r"REG:(\d+).*?STACK:(\d+)", usage, re.DOTALL)
            rows.append({**meta, "num_warps": warps, "num_stages": stages, "votes": votes,
                         "registers": int(found.group(1)), "spill_stack_bytes": int(found.group(2)),
                         "shared_bytes": kernel.metadata.shared})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=96)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--resources", action="store_true", help="compile for --arch offline, print register use")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args()
    if args.resources:
        for row in resources(args.arch, args.head_dim, args.group):
            print(json.dumps(row))
        return 0
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
    store = LayerStore().allocate(batch, heads, d, count + 1, torch.bfloat16, dev)

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

    def decode():
        buf = store.buffers()
        return ragged_decode_triton(query, buf.keys, buf.values, buf.positions, buf.offsets, buf.lengths,
                                    store.kv_heads, qpos, d ** -0.5)

    out = {}
    for backend in ("torch", "triton"):
        dispatch.set_kernel_backend(backend)
        out[f"compact_{backend}_ms"] = timed(lambda: store.write_selection(keys, values, positions,
                                                                           Selection(index, count)))
    query = torch.randn(batch, heads * args.group, 1, d, device=dev, dtype=torch.bfloat16)
    qpos = torch.full((batch, 1), n, device=dev)
    dispatch.set_kernel_backend("torch")
    ref = dispatch.ragged_attention(query, store, qpos, d ** -0.5)
    out["max_abs_diff"] = float((ref.float() - decode().float()).abs().max())
    out["decode_torch_ms"] = timed(lambda: dispatch.ragged_attention(query, store, qpos, d ** -0.5))
    out["decode_triton_ms"] = timed(decode)
    out["device"] = torch.cuda.get_device_name()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
