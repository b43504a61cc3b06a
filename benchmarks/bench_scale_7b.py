"""Memory and time at Mistral-7B's attention shapes on a CPU: profiling and compressed generation.

The model is random (``benchmarks/gpu_check.py``'s builder, no download): hidden 4096, 32 query heads,
8 KV heads, head_dim 128 (GQA 4), a few decoder layers, a BPE tokenizer of 2,000 tokens trained on the
shipped haystack. Shapes and costs only, no quality.

    python benchmarks/bench_scale_7b.py profile --lengths 1000 2000 4000 8000 10000 --out scale7b/profile.jsonl
    python benchmarks/bench_scale_7b.py generate --length 32768 --out scale7b/generate.jsonl
    python benchmarks/bench_scale_7b.py report scale7b/profile.jsonl scale7b/generate.jsonl

``profile`` runs, for each length, a reference-mode and a fast-mode profile (one reasoning needle at
depths 0, 50 and 100%, likelihood gate) of the same trials; ``generate`` runs
``headprobe.generate_compressed`` (SnapKV, capacity 128) and ``model.generate`` with the stock
``DynamicCache`` on the same prompt of haystack tokens. Every (mode, length) runs in a fresh process,
which builds the model, runs a short warm-up forward, then resets the kernel's peak-RSS mark
(``/proc/self/clear_refs``) and notes its resident memory as the baseline; after the measured call it
reads the peak (``VmHWM``, the figure ``getrusage`` reports as ``ru_maxrss``). Inside the measured call a
``TorchDispatchMode`` records the largest tensor any operator returned. Results are appended as JSON
lines (one per process; a rerun skips what the file already holds); ``report`` prints the tables and the
growth exponents (least-squares slope of log seconds and of log peak-over-baseline against log length).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FORMAT = "headprobe-bench-scale-7b"


# ---- memory of this process -------------------------------------------------------------------------

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> int:
    """Reset the peak-RSS mark of this process; returns the resident memory now (KiB)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def peak_kib() -> int:
    """Peak resident memory since the last :func:`reset_peak` (KiB)."""
    return _status_kib("VmHWM")


def _storage(t) -> int:
    return t.untyped_storage().data_ptr()


class LargestTensor:
    """A ``TorchDispatchMode`` (built lazily) recording the largest tensor any operator allocates (outputs
    that are views of an input are skipped)."""

    def __new__(cls):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        class _Watch(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.bytes = 0
                self.where = ""

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                inputs = {_storage(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
                for t in tree_flatten(out)[0]:
                    if (isinstance(t, torch.Tensor) and t.numel() * t.element_size() > self.bytes
                            and _storage(t) not in inputs):          # views (t(), expand) allocate nothing
                        self.bytes = t.numel() * t.element_size()
                        self.where = f"{func.__name__} {list(t.shape)} {str(t.dtype).replace('torch.', '')}"
                return out

        return _Watch()


# ---- the model (gpu_check's builder at CPU sizes) ---------------------------------------------------

def build(args: argparse.Namespace, work_dir: Path, max_context: int):
    sys.path.insert(0, str(HERE))
    import torch
    from gpu_check import DRY, Workbench

    shapes = dataclasses.replace(DRY, device="cpu", dtype=args.dtype, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                                 layers=args.layers, intermediate=args.intermediate, max_context=max_context,
                                 tokenizer_vocab=2000)
    bench = Workbench(shapes, work_dir)
    loaded = bench.loaded()
    with torch.no_grad():                                          # first-call allocations out of the way
        loaded.model(input_ids=torch.arange(3, 35)[None], use_cache=False)
    return bench, loaded


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- one measurement per process ---------------------------------------------------------------------

def one_profile(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import headprobe

    work = Path(tempfile.mkdtemp(prefix="scale7b-"))
    bench, loaded = build(args, work, max_context=max(args.length + 256, 2048))
    sys.path.insert(0, str(HERE))
    from gpu_check import passing_needles

    needles = passing_needles(loaded.tokenizer, 1)
    depths = [d / 100 for d in args.depths]
    request = headprobe.ProfileRequest(
        probes=["retrieval_reasoning"], lengths=[args.length], depths=depths, out_dir=work / "out", mode=args.mode,
        needle_ids=needles, haystack=str(bench.haystack()), chat_template=False, batch_size=args.batch_size,
        gate="likelihood", max_new_tokens=8, force=True)
    baseline = reset_peak()
    watch = LargestTensor()
    start = time.perf_counter()
    with watch:
        try:
            result = headprobe.run_profile(loaded, request)
        except headprobe.NoPassingTrialsError:
            result = None
    seconds = time.perf_counter() - start
    peak = peak_kib()
    log = result.logs[0] if result is not None else next((work / "out").rglob("*.jsonl"))
    _, records = headprobe.read_log(log)
    return {"kind": "profile", "mode": args.mode, "length": args.length, "trials": len(records),
            "prompt_tokens": [r["prompt_tokens"] for r in records], "seconds": round(seconds, 2),
            "seconds_per_trial": round(seconds / max(1, len(records)), 2),
            "trial_seconds": [r.get("seconds") for r in records],
            "passed_likelihood": sum(bool(r["gates"].get("likelihood")) for r in records),
            "baseline_mib": round(baseline / 1024, 1), "peak_mib": round(peak / 1024, 1),
            "over_baseline_mib": round((peak - baseline) / 1024, 1),
            "largest_tensor_mib": round(watch.bytes / 2**20, 1), "largest_tensor": watch.where,
            "batch_size": args.batch_size, "depths": args.depths, "needles": needles, **_machine(args, loaded, torch)}


def one_generate(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import headprobe

    work = Path(tempfile.mkdtemp(prefix="scale7b-"))
    bench, loaded = build(args, work, max_context=args.length + args.new_tokens + 64)
    tok, model = loaded.tokenizer, loaded.model
    ids = tok(bench.haystack().read_text(), add_special_tokens=False)["input_ids"][:args.length]
    if len(ids) < args.length:
        raise SystemExit(f"haystack has {len(ids)} tokens, fewer than {args.length}")
    prompt = torch.tensor([ids])
    mask = torch.ones_like(prompt)
    common = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False,
              "pad_token_id": tok.pad_token_id}
    baseline = reset_peak()
    watch = LargestTensor()
    start = time.perf_counter()
    with watch, torch.no_grad():
        if args.cache == "compressed":
            res = headprobe.generate_compressed(loaded, input_ids=prompt, attention_mask=mask, policy=args.policy,
                                                capacity=args.capacity, **common)
            cache_bytes, new = res.memory_bytes, res.new_tokens
        else:
            out = model.generate(input_ids=prompt, attention_mask=mask, **common)   # stock DynamicCache
            new = out[:, prompt.shape[1]:]
            cache_bytes = 2 * args.layers * 8 * 128 * torch.finfo(model.dtype).bits // 8 * (out.shape[1] - 1)
    seconds = time.perf_counter() - start
    peak = peak_kib()
    return {"kind": "generate", "cache": args.cache, "policy": args.policy if args.cache == "compressed" else None,
            "capacity": args.capacity if args.cache == "compressed" else None, "length": args.length,
            "new_tokens": int(new.shape[1]), "seconds": round(seconds, 2), "cache_bytes": int(cache_bytes),
            "baseline_mib": round(baseline / 1024, 1), "peak_mib": round(peak / 1024, 1),
            "over_baseline_mib": round((peak - baseline) / 1024, 1),
            "largest_tensor_mib": round(watch.bytes / 2**20, 1), "largest_tensor": watch.where,
            **_machine(args, loaded, torch)}


def _machine(args: argparse.Namespace, loaded, torch) -> dict[str, Any]:
    return {"layers": args.layers, "intermediate": args.intermediate, "dtype": args.dtype,
            "parameters": _params(loaded.model), "threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M", time.localtime())}


# ---- drivers --------------------------------------------------------------------------------------------

def _done(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_child(argv: list[str], out: Path) -> None:
    """Run one measurement in a fresh process and append its JSON line to ``out``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
    print("$", " ".join(argv), flush=True)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"measurement failed: {' '.join(argv)}")
    line = proc.stdout.strip().splitlines()[-1]
    json.loads(line)
    with out.open("a") as f:
        f.write(line + "\n")
    print(line, flush=True)


def _model_args(args: argparse.Namespace) -> list[str]:
    return ["--layers", str(args.layers), "--intermediate", str(args.intermediate), "--dtype", args.dtype]


def drive_profile(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    have = {(r["mode"], r["length"]) for r in _done(out) if r.get("kind") == "profile"}
    for length in args.lengths:
        for mode in args.modes:
            if (mode, length) in have:
                continue
            _run_child(["_profile", "--mode", mode, "--length", str(length), "--batch-size", str(args.batch_size),
                        "--depths", *map(str, args.depths), *_model_args(args)], out)


def drive_generate(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    have = {(r["cache"], r["length"]) for r in _done(out) if r.get("kind") == "generate"}
    for cache in args.caches:
        if (cache, args.length) in have:
            continue
        _run_child(["_generate", "--cache", cache, "--length", str(args.length), "--new-tokens", str(args.new_tokens),
                    "--capacity", str(args.capacity), "--policy", args.policy, *_model_args(args)], out)


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``log y`` against ``log x`` (the growth exponent)."""
    import numpy as np

    pts = [(x, y) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    lx, ly = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(lx, ly, 1)[0])


def report(args: argparse.Namespace) -> None:
    rows = [r for path in args.files for r in _done(Path(path))]
    prof = sorted((r for r in rows if r["kind"] == "profile"), key=lambda r: (r["length"], r["mode"] != "reference"))
    if prof:
        print("| length | prompt tokens | mode | trials | s / trial | peak over baseline MiB | largest tensor | "
              "load avg |")
        print("|---:|---:|---|---:|---:|---:|---|---|")
        for r in prof:
            tokens = max(r["prompt_tokens"]) if r["prompt_tokens"] else ""
            print(f"| {r['length']} | {tokens} | {r['mode']} | {r['trials']} | {r['seconds_per_trial']} | "
                  f"{r['over_baseline_mib']} | {r['largest_tensor_mib']} MiB `{r['largest_tensor']}` | "
                  f"{' '.join(map(str, r['load_average']))} |")
        print()
        print("| mode | time exponent | memory exponent | largest-tensor exponent | lengths fitted |")
        print("|---|---:|---:|---:|---|")
        for mode in ("reference", "fast"):
            mine = [r for r in prof if r["mode"] == mode]
            for lo in (0, 2000):
                sel = [r for r in mine if r["length"] >= lo]
                if len(sel) < 2:
                    continue
                xs = [max(r["prompt_tokens"]) for r in sel]
                fit = [slope(xs, [r[k] for r in sel]) for k in ("seconds_per_trial", "over_baseline_mib",
                                                                "largest_tensor_mib")]
                print(f"| {mode} | " + " | ".join(f"{f:.2f}" if f is not None else "" for f in fit)
                      + f" | {', '.join(str(r['length']) for r in sel)} |")
        print()
        by = {(r["mode"], r["length"]): r for r in prof}
        print("| length | reference / fast time |")
        print("|---:|---:|")
        for length in sorted({r["length"] for r in prof}):
            if ("reference", length) in by and ("fast", length) in by:
                ratio = by[("reference", length)]["seconds_per_trial"] / by[("fast", length)]["seconds_per_trial"]
                print(f"| {length} | {ratio:.2f}x |")
        print()
    gen = [r for r in rows if r["kind"] == "generate"]
    if gen:
        print("| cache | prompt | new tokens | seconds | cache MiB | peak over baseline MiB | largest tensor | load avg |")
        print("|---|---:|---:|---:|---:|---:|---|---|")
        for r in gen:
            name = f"{r['policy']} capacity {r['capacity']}" if r["cache"] == "compressed" else "stock DynamicCache"
            print(f"| {name} | {r['length']} | {r['new_tokens']} | {r['seconds']} | {r['cache_bytes'] / 2**20:.1f} | "
                  f"{r['over_baseline_mib']} | {r['largest_tensor_mib']} MiB `{r['largest_tensor']}` | "
                  f"{' '.join(map(str, r['load_average']))} |")


# ---- command line ------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
        p.add_argument("--intermediate", type=int, default=14336, help="MLP size (default Mistral-7B's 14336)")
        p.add_argument("--dtype", default="float32")

    p = sub.add_parser("profile", help="reference and fast profiling, one fresh process per (mode, length)")
    p.add_argument("--lengths", nargs="+", type=int, default=[1000, 2000, 4000, 8000, 10000])
    p.add_argument("--modes", nargs="+", default=["reference", "fast"], choices=["reference", "fast"])
    p.add_argument("--depths", nargs="+", type=float, default=[0, 50, 100])
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--out", required=True, help="JSON-lines file (appended to; done entries are skipped)")
    model_flags(p)
    p = sub.add_parser("generate", help="generate_compressed against model.generate with the stock cache")
    p.add_argument("--length", type=int, default=32768)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--capacity", type=int, default=128)
    p.add_argument("--policy", default="snapkv")
    p.add_argument("--caches", nargs="+", default=["compressed", "full"], choices=["compressed", "full"])
    p.add_argument("--out", required=True)
    model_flags(p)
    p = sub.add_parser("report", help="tables and growth exponents from the JSON-lines files")
    p.add_argument("files", nargs="+")
    p = sub.add_parser("_profile")
    p.add_argument("--mode", required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--depths", nargs="+", type=float, required=True)
    p.add_argument("--batch-size", type=int, default=1)
    model_flags(p)
    p = sub.add_parser("_generate")
    p.add_argument("--cache", required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--capacity", type=int, default=128)
    p.add_argument("--policy", default="snapkv")
    model_flags(p)
    args = parser.parse_args(argv)
    if args.command == "profile":
        drive_profile(args)
    elif args.command == "generate":
        drive_generate(args)
    elif args.command == "report":
        report(args)
    elif args.command == "_profile":
        print(json.dumps({"format": FORMAT, **one_profile(args)}))
    else:
        print(json.dumps({"format": FORMAT, **one_generate(args)}))


if __name__ == "__main__":
    main()
