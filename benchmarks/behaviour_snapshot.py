"""Snapshot what headprobe computes on SmolLM2, to show that a change of structure changed no result.

    python benchmarks/behaviour_snapshot.py run --out before/          # on the old code
    python benchmarks/behaviour_snapshot.py run --out after/           # on the new code
    python benchmarks/behaviour_snapshot.py compare before/ after/     # exit 1 if any result differs

``run`` drives the command line as a user does, on small grids: every probe in each mode (fast,
reference, reuse), every allocation method from those profiles, and one eval cell per policy (each
method's preset and the full cache). ``compare`` reads every JSON file both folders hold and compares
them field by field, leaving out only what differs between two runs of the same code: creation times,
durations, the headprobe version, file paths and the fingerprints computed over those. Scores are compared
exactly (to the last bit), as are budgets, answers and cache bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Fields that differ between two runs of the same code (or name the folder a run wrote to).
VOLATILE = {"created", "seconds", "wall_seconds", "elapsed", "headprobe_version", "version_of_headprobe",
            "fingerprint", "source_path", "sources", "path", "paths", "started", "finished", "seconds_per_trial",
            "prefill_seconds", "decode_ms_per_token", "ms_per_token", "time", "timing", "timings", "host",
            "command", "log", "profile_path", "out", "created_by", "mean_seconds"}

PROFILE_GRID = ["--lengths", "400", "--depths", "0", "50", "100", "--needles", "r01", "r02", "q01", "q02",
                "--samples-per-task", "1"]
MODES = {"fast": [], "reference": ["--mode", "reference"], "reuse": ["--mode", "reuse"]}
ALLOCATIONS = {
    "uniform": [], "pyramid": [], "headkv": ["--beta", "1.01"],
    "headkv-compat": ["--beta", "1.2", "--compat", "headkv"],
    "dynamickv": [], "combined": ["--beta", "1.01"],
}
EVAL_SETTINGS = ["full", "snapkv", "streaming", "keydiff", "morphkv", "keepkv", "dynamickv", "pyramid",
                 "headkv-r", "headkv-er", "headkv-r2", "combined", "headkv-r[window=32]"]


def _headprobe(*argv: str, cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "headprobe", *argv], cwd=cwd, env=env, check=True)
    print(f"  {' '.join(argv[:3])} ... {time.perf_counter() - start:.0f} s", flush=True)


def run(out: Path) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=False)
    data = out / "data"
    os.environ["HEADPROBE_DATA"] = str(data)
    for mode, flags in MODES.items():
        _headprobe("profile", "--device", "cpu", *PROFILE_GRID, *flags, "--out-dir", f"profiles-{mode}",
                   "--name", "snap", cwd=out)
    profiles = out / "profiles-fast"
    heads = str(profiles / "snap.retrieval_reasoning.json")
    layers = str(profiles / "snap.layer_retention.json")
    reads = {"uniform": [], "pyramid": [], "headkv": [heads], "headkv-compat": [heads], "dynamickv": [layers],
             "combined": [heads, layers]}
    (out / "budgets").mkdir()
    for name, flags in ALLOCATIONS.items():
        method = name.split("-")[0]
        profile_flags = [x for p in reads[name] for x in ("--profile", p)]
        _headprobe("allocate", "--method", method, *profile_flags, *(["--model", "smollm2-135m"]
                   if not reads[name] else []), "--capacity", "64", *flags, "-o", f"budgets/{name}.json", cwd=out)
    data.mkdir(parents=True, exist_ok=True)
    for path in profiles.glob("snap.*.json"):        # eval's settings find the newest profile of each kind here
        (data / "profiles").mkdir(exist_ok=True)
        (data / "profiles" / f"smollm2-135m.{path.name.split('.', 1)[1]}").write_bytes(path.read_bytes())
    _headprobe("eval", "--device", "cpu", "--settings", *EVAL_SETTINGS, "--capacities", "64", "--lengths", "400",
               "--depths", "50", "--needle-ids", "r01", "r02", "--out", "eval.json", "--plot", "none", cwd=out)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _differences(a: Any, b: Any, where: str, found: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                found.append(f"{where}.{key}: only in {'after' if key in b else 'before'}")
            else:
                _differences(a[key], b[key], f"{where}.{key}", found)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _differences(x, y, f"{where}[{i}]", found)
    elif a != b or type(a) is not type(b):
        found.append(f"{where}: {str(a)[:80]} != {str(b)[:80]}")


def _records(path: Path) -> Any:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def compare(before: Path, after: Path) -> int:
    files = sorted(p.relative_to(before) for p in before.rglob("*") if p.suffix in (".json", ".jsonl")
                   and "data" not in p.relative_to(before).parts)
    bad = 0
    for rel in files:
        other = after / rel
        if not other.exists():
            print(f"{rel}: missing after")
            bad += 1
            continue
        found: list[str] = []
        _differences(_strip(_records(before / rel)), _strip(_records(other)), "", found)
        print(f"{rel}: {'same' if not found else f'{len(found)} differences'}")
        for line in found[:10]:
            print(f"    {line}")
        bad += bool(found)
    print(f"{len(files)} files compared, {bad} differ")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
