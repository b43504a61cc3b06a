"""Scaling out and up, each measured against the plain way in the same run.

``ranks``: the same ``headprobe profile`` (and ``headprobe eval``) command as one process and as
``torchrun --standalone --nproc-per-node N``, wall time of each command and whether the outputs are the
same (profile fingerprints; eval cells without their times). Each process uses one thread.

``offload``: SmolLM2 in memory versus with layers offloaded to disk by accelerate (the embedding, the
head, the final norm and every other layer), a small profile and a compressed generation on each: wall
time and whether the scores and tokens are the same.

    python benchmarks/bench_scale.py ranks --ranks 2
    python benchmarks/bench_scale.py offload
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

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg",
       "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli"), os.environ.get("PYTHONPATH", "")])}
PROFILE = ["profile", "--device", "cpu", "--probe", "retrieval", "enhanced_retrieval", "--lengths", "1000",
           "--depths", "0", "33", "67", "100", "--needles", "r01", "r02", "r03", "r04"]
EVAL = ["eval", "--device", "cpu", "--settings", "full", "snapkv", "headkv-r2", "--capacities", "64",
        "--lengths", "1000", "--depths", "0", "33", "67", "100", "--needle-ids", "r01", "r02", "--plot", "none"]
TIMES = {"seconds", "ms_per_token", "created", "mean_seconds"}


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def _untimed(obj):
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k not in TIMES}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def bench_ranks(ranks: int) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                "-m", "headprobe"]
    single = [sys.executable, "-m", "headprobe"]
    print(f"{'command':>8} {'1 process s':>12} {f'{ranks} ranks s':>10} {'speed-up':>9}  same output")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        one = _timed([*single, *PROFILE, "--out-dir", str(tmp / "one")])
        many = _timed([*launcher, *PROFILE, "--out-dir", str(tmp / "ranks")])
        same = all(json.loads((tmp / "one" / f"smollm2-135m.{k}.json").read_text())["fingerprint"]
                   == json.loads((tmp / "ranks" / f"smollm2-135m.{k}.json").read_text())["fingerprint"]
                   for k in ("retrieval", "enhanced_retrieval"))
        print(f"{'profile':>8} {one:>12.1f} {many:>10.1f} {one / many:>8.2f}x  {same} (profile fingerprints)")
        one = _timed([*single, *EVAL, "--out", str(tmp / "one" / "eval.json")])
        many = _timed([*launcher, *EVAL, "--out", str(tmp / "ranks" / "eval.json")])
        a, b = (json.loads((tmp / d / "eval.json").read_text())["cells"] for d in ("one", "ranks"))
        print(f"{'eval':>8} {one:>12.1f} {many:>10.1f} {one / many:>8.2f}x  {_untimed(a) == _untimed(b)} "
              f"({len(a)} cells)")


def bench_offload() -> None:
    import torch

    import headprobe

    torch.set_num_threads(1)
    memory = headprobe.load_model("smollm2-135m", device="cpu")
    layers = memory.identity.num_layers
    placed = {"model.embed_tokens": "disk", "lm_head": "disk", "model.norm": "disk", "model.rotary_emb": "cpu"}
    placed.update({f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(layers)})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        offloaded = headprobe.load_model("smollm2-135m", device_map=placed, offload_folder=tmp / "offload",
                                         dtype="float32")
        on_disk = sum(1 for where in offloaded.model.hf_device_map.values() if where == "disk")
        print(f"{on_disk} of {len(placed)} modules on disk; torch threads 1")
        print(f"{'work':>22} {'in memory s':>12} {'offloaded s':>12} {'slow-down':>10}  same output")
        seconds, fingerprints = {}, {}
        for name, lm in (("memory", memory), ("offloaded", offloaded)):
            request = headprobe.ProfileRequest(probes=["retrieval"], lengths=[1000], depths=[0.0, 0.5, 1.0],
                                               out_dir=tmp / name, needle_ids=["r01", "r02", "r03", "r04"])
            start = time.perf_counter()
            result = headprobe.run_profile(lm, request)
            seconds[name] = time.perf_counter() - start
            fingerprints[name] = headprobe.Profile.load(result.profiles[0]).fingerprint
        print(f"{'profile (12 trials)':>22} {seconds['memory']:>12.1f} {seconds['offloaded']:>12.1f} "
              f"{seconds['offloaded'] / seconds['memory']:>9.2f}x  {fingerprints['memory'] == fingerprints['offloaded']}")
        prompt = "The harbour office keeps its records. The secret code is blue tulip seven. " * 40 + "The code?"
        outputs = {}
        for name, lm in (("memory", memory), ("offloaded", offloaded)):
            start = time.perf_counter()
            outputs[name] = headprobe.generate_compressed(lm, prompt, policy="snapkv", capacity=64, max_new_tokens=32,
                                                          chat=True).sequences
            seconds[name] = time.perf_counter() - start
        same = bool(torch.equal(outputs["memory"], outputs["offloaded"]))
        print(f"{'generate (32 tokens)':>22} {seconds['memory']:>12.1f} {seconds['offloaded']:>12.1f} "
              f"{seconds['offloaded'] / seconds['memory']:>9.2f}x  {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["ranks", "offload"])
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.what == "ranks":
        bench_ranks(args.ranks)
    else:
        bench_offload()


if __name__ == "__main__":
    main()
