"""A shard, or a torchrun rank, that the grid deals no trial writes no log (docs/formats.md: there is no
header-only log), and the ranks that had work still make the profile one process makes."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from torchrun_launch import run_torchrun

import headprobe
from headprobe import ProfileRequest, run_profile
from headprobe.profile import Profile

ROOT = Path(__file__).resolve().parents[2]

#: One layer-retention sample: shard 0 of 2 gets it, shard 1 gets nothing.
ONE_SAMPLE = {"probes": ["layer_retention"], "tasks": ["code"], "samples_per_task": 1,
              "retention": headprobe.RetentionConfig(max_tokens=256), "chat_template": False}


def test_a_shard_with_no_trials_writes_no_log(tiny_llama, tmp_path):
    empty = run_profile(tiny_llama, ProfileRequest(**ONE_SAMPLE, out_dir=tmp_path, shard=(1, 2), name="tiny"))
    assert empty.logs == [] and empty.trials_run == 0 and list(tmp_path.iterdir()) == []
    full = run_profile(tiny_llama, ProfileRequest(**ONE_SAMPLE, out_dir=tmp_path, shard=(0, 2), name="tiny"))
    assert [p.name for p in full.logs] == ["tiny.layer_retention.shard0of2.trials.jsonl"] and full.trials_run == 1
    # the shard that had the sample is the whole grid: it merges alone, its missing partner lacks nothing
    merged = headprobe.merge_profile_logs(full.logs, tmp_path / "merged")
    assert Profile.load(merged[0]).trials == {"total": 1, "passed": 1, "per_task": {"code": 1}}


def test_a_torchrun_rank_with_no_work_writes_no_log(tiny_llama, tmp_path):
    """Two ranks, one sample: rank 1 writes nothing, rank 0 writes the profile one process writes."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(f"""
        import json
        import conftest
        import headprobe
        request = headprobe.ProfileRequest(probes=["layer_retention"], tasks=["code"], samples_per_task=1,
                                           retention=headprobe.RetentionConfig(max_tokens=256),
                                           chat_template=False, out_dir={str(tmp_path / "ranks")!r}, name="tiny")
        with headprobe.process_group() as ranks:
            result = headprobe.run_profile_on_ranks(conftest.make_tiny_llama(), request, ranks)
        with open({str(tmp_path / "results")!r} + f"/rank{{ranks.rank}}.json", "w") as f:    # one file a rank
            json.dump({{"logs": [str(p) for p in result.logs], "profiles": [str(p) for p in result.profiles]}}, f)
    """))
    (tmp_path / "results").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli"), str(ROOT / "tests")])}
    proc = run_torchrun([str(script)], env, fresh=[tmp_path / "ranks"], timeout=300)   # results: rewritten
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "ranks"
    assert sorted(p.name for p in out.iterdir()) == ["tiny.layer_retention.json",
                                                      "tiny.layer_retention.shard0of2.trials.jsonl"]
    results = [json.loads((tmp_path / "results" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == {"logs": [str(out / "tiny.layer_retention.shard0of2.trials.jsonl")],
                          "profiles": [str(out / "tiny.layer_retention.json")]}
    assert results[1] == {"logs": [], "profiles": []}
    one = run_profile(tiny_llama, ProfileRequest(**ONE_SAMPLE, out_dir=tmp_path / "one", name="tiny"))
    single, merged = (json.loads(Path(p).read_text()) for p in (one.profiles[0], out / "tiny.layer_retention.json"))
    assert merged["retention"] == single["retention"] and merged["fingerprint"] == single["fingerprint"]
    assert merged["probe"]["shard"] is None and merged["trials"] == single["trials"]
