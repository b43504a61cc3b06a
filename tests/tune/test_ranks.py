"""``torchrun --nproc-per-node 2 -m headprobe tune`` (gloo) chooses and reports what one process does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from torchrun_launch import run_torchrun

ROOT = Path(__file__).resolve().parents[2]

ARGS = ["--lengths", "200", "260", "--depths", "25", "75", "--needle-ids", "r01", "r02", "r03", "r04",
        "--holdout-ids", "r04", "--capacities", "16", "24", "--max-new-tokens", "2", "--no-chat-template",
        "--policies", "snapkv", "streaming", "--allocations", "uniform", "pyramid",
        "--values", "window=4,8", "kernel_size=7", "--presets", "full", "pyramid", "streaming", "--device", "cpu"]


def _script(tmp_path: Path) -> Path:
    """The command line with the stubbed scorer of ``synthetic_scores`` (each setting's accuracy known)."""
    script = tmp_path / "tune_scored.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from tune.synthetic_scores import install
        install()
        from headprobe_cli.main import main
        sys.exit(main(sys.argv[1:]))
    """))
    return script


def _comparable(report: dict, folder: Path) -> dict:
    text = json.dumps({k: report[k] for k in ("capacities", "split", "rule", "space", "grid")})
    out = json.loads(text.replace(str(folder), "OUT"))
    for cap in out["capacities"]:
        for row in cap["holdout"]:
            row.pop("cache_bytes")          # the same in both, but written as a float mean: compare the trials
    return out


def test_two_ranks_choose_and_report_what_one_process_does(tmp_path, tiny_dir):
    script = _script(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli"), str(ROOT / "tests")])}
    one, two = tmp_path / "one", tmp_path / "two"
    proc = subprocess.run([sys.executable, str(script), "tune", "--model", str(tiny_dir), *ARGS,
                           "--out", str(one / "t.json")], check=False, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_torchrun([str(script), "tune", "--model", str(tiny_dir), *ARGS, "--out", str(two / "t.json")], env,
                        fresh=[two], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = json.loads((one / "t.json").read_text())
    b = json.loads((two / "t.json").read_text())
    assert _comparable(a, one) == _comparable(b, two)
    assert a["cost"]["trials"] == b["cost"]["trials"]
    assert [r["file"] for r in a["cost"]["runs"]] == [r["file"] for r in b["cost"]["runs"]]
    # each rank ran its share of every eval run's (length, depth) groups, in its own log
    for run in b["cost"]["runs"]:
        stem = run["file"].removesuffix(".json")
        shards = [two / "t.runs" / f"{stem}.shard{r}of2.cells.jsonl" for r in (0, 1)]
        assert all(s.exists() for s in shards)
    assert (two / "t.c16.budget.json").read_text().replace(str(two), "") \
        .split('"created"')[0] == (one / "t.c16.budget.json").read_text().replace(str(one), "").split('"created"')[0]
