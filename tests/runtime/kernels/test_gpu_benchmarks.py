"""The GPU check script runs end to end (CPU dry run), and the decode kernel compiles for sm_90 without
spilling registers (compiled offline, no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return env


@pytest.mark.slow
def test_gpu_check_dry_run_writes_every_section_ok(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("scipy")
    cmd = [sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["format"] == "headprobe-gpu-check" and report["version"] == 1 and report["dry_run"] is True
    sections = report["sections"]
    assert list(sections) == ["copy_bandwidth", "compaction", "ragged_decode", "profile_forward",
                              "profile_modes", "compressed_decode", "decode_step"]
    for name, section in sections.items():
        assert section["ok"] is True and "error" not in section, name
    assert sections["copy_bandwidth"]["gb_per_s"] > 0
    compaction = sections["compaction"]["rows"]
    assert all(row["exact"] and row["kept_pairs"] == row["segments"] * row["budget"] for row in compaction)
    assert {row["batch"] for row in compaction} == {1, 2}
    assert all(row["gpu_us"] is None and "CUDA" in row["gpu_time"] for row in compaction)   # no graph on CPU
    assert all(row["close"] and row["max_abs_diff"] <= 1e-4 for row in sections["ragged_decode"]["rows"])
    assert {row["batch"] for row in sections["ragged_decode"]["rows"]} == {1, 2}
    assert any(row["splits_per_head"] > 1 for row in sections["ragged_decode"]["rows"])      # split-K ran
    assert sections["profile_forward"]["scores_finite"] and sections["profile_forward"]["trials"] == 3
    assert sections["profile_modes"]["spearman"] >= 0.95
    runs = sections["compressed_decode"]["runs"]
    assert sections["compressed_decode"]["launch_failure"] is None
    assert runs["snapkv_triton"]["cache_bytes"] < runs["sdpa_full_cache"]["cache_bytes"]
    assert runs["full_triton"]["leading_tokens_equal_to_sdpa"] == sections["compressed_decode"]["new_tokens"]
    step = sections["decode_step"]
    assert step["layers"] == 2 and len(step["rows"]) == 2 * 2 * 3          # prompts x batches x runs
    for row in step["rows"]:
        assert row["steps"] == step["new_tokens"] - 1 and row["decode_ms_per_token"] > 0
        assert 0 <= row["cache_share"] <= 1 and 0 < row["kv_bytes_read"] <= row["cache_bytes"]
        full = next(r for r in step["rows"] if (r["prompt"], r["batch"], r["run"])
                    == (row["prompt"], row["batch"], "sdpa_full_cache"))
        assert full["cache_bytes"] == 2 * 2 * 2 * 16 * 4 * row["batch"] * row["prompt"]   # K,V x layers x heads
        if row["run"] != "sdpa_full_cache":
            assert row["cache_bytes"] < full["cache_bytes"]                 # compressed for real
            assert row["speedup_vs_sdpa"] > 0
        if row["run"] == "snapkv_triton":
            assert row["speedup_vs_torch_path"] > 0
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert all(f"## {name}: ok" in markdown for name in sections)
    assert "speedup_vs_torch_path" in markdown                   # a figure only some rows have gets its column
    again = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode != 0 and "exists" in again.stderr                # results are not overwritten


@pytest.mark.slow
def test_decode_kernel_compiles_for_sm90_without_spills():
    """Every autotuning configuration at Mistral's decode shape: no spill stack, registers well under the
    255 the broadcast-and-sum kernel hit."""
    triton = pytest.importorskip("triton")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip("Triton's bundled CUDA tools are not installed")
    proc = subprocess.run([sys.executable, "benchmarks/bench_runtime_gpu.py", "--resources", "--arch", "90"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 24
    assert all(row["spill_stack_bytes"] == 0 for row in rows), rows
    assert max(row["registers"] for row in rows) <= 168, rows
