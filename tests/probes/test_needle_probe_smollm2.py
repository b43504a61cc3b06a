"""Needle probes on the real SmolLM2-135M-Instruct: modes agree, resume and shards are lossless,
retrieval scores are sparse and enhanced-retrieval scores dense."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

import headprobe
from headprobe import ProfileRequest, run_profile

pytestmark = pytest.mark.slow

NEEDLES = ["r01", "r02"]


def _request(out: Path, mode: str = "fast", **kw) -> ProfileRequest:
    return ProfileRequest(probes=["retrieval", "enhanced_retrieval"], lengths=[500], depths=[0.5, 1.0],
                          out_dir=out, mode=mode, needle_ids=NEEDLES, **kw)


@pytest.fixture(scope="module")
def fast_run(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("fast")
    result = run_profile(smollm2, _request(out))
    return out, result


def _scores(path: Path, kind: str) -> np.ndarray:
    return np.array(headprobe.Profile.load(path / f"smollm2-135m.{kind}.json").query_heads)


def test_fast_profile_written_and_valid(fast_run):
    out, result = fast_run
    assert result.trials_run == 4 and not result.failures
    profile = headprobe.Profile.load(out / "smollm2-135m.retrieval.json")
    assert profile.trials["passed"] >= 3
    assert profile.model.num_layers == 30 and len(profile.kv_heads[0]) == 3
    lines = headprobe.summarize_file(out / "smollm2-135m.retrieval.json")
    assert any("needle r01" in line for line in lines)


def test_retrieval_sparse_enhanced_dense(fast_run):
    out, _ = fast_run
    retrieval = _scores(out, "retrieval")
    enhanced = _scores(out, "enhanced_retrieval")
    assert (retrieval == 0).mean() > 0.6
    assert (enhanced == 0).mean() < (retrieval == 0).mean()


def test_reference_mode_agrees_with_fast(fast_run, smollm2, tmp_path):
    out, _ = fast_run
    run_profile(smollm2, _request(tmp_path, mode="reference"))
    for kind in ("enhanced_retrieval", "retrieval"):
        fast = _scores(out, kind).ravel()
        ref = _scores(tmp_path, kind).ravel()
        rho = spearmanr(fast, ref)[0]
        assert rho > 0.8, (kind, rho)
        top_fast = set(np.argsort(-fast)[:10])
        top_ref = set(np.argsort(-ref)[:10])
        assert len(top_fast & top_ref) >= 6, kind


def test_resume_after_interruption_gives_same_profile(fast_run, smollm2, tmp_path):
    out, _ = fast_run
    log = (out / "smollm2-135m.retrieval.trials.jsonl").read_text().splitlines()
    # an interrupted run: header, two finished trials, and half a line
    (tmp_path / "smollm2-135m.retrieval.trials.jsonl").write_text("\n".join(log[:3]) + "\n" + log[3][:40])
    with pytest.raises(headprobe.HeadprobeError, match="pass resume=True"):
        run_profile(smollm2, _request(tmp_path))
    result = run_profile(smollm2, _request(tmp_path, resume=True))
    assert result.trials_skipped == 2 and result.trials_run == 2
    for kind in ("retrieval", "enhanced_retrieval"):
        np.testing.assert_allclose(_scores(tmp_path, kind), _scores(out, kind), atol=1e-5)
    lines = (tmp_path / "smollm2-135m.retrieval.trials.jsonl").read_text().splitlines()
    assert len(lines) == 5 and all(json.loads(line) for line in lines)


def test_shards_merge_to_one_run(fast_run, smollm2, tmp_path):
    out, _ = fast_run
    logs = []
    for i in range(2):
        result = run_profile(smollm2, _request(tmp_path, shard=(i, 2)))
        assert result.profiles == []
        logs += result.logs
    merged = headprobe.merge_profile_logs(logs, tmp_path / "merged")
    assert len(merged) == 2
    for kind in ("retrieval", "enhanced_retrieval"):
        np.testing.assert_allclose(_scores(tmp_path / "merged", kind), _scores(out, kind), atol=1e-5)


def test_no_passing_trial_is_an_error_not_a_profile(smollm2, tmp_path):
    needle = {"id": "x1", "kind": "retrieval", "needle": "The vault number is 8841-QZ-7730-KP.",
              "question": "What colour is the sky on Mars according to the document?", "answer": "8841-QZ-7730-KP"}
    path = tmp_path / "hard.jsonl"
    path.write_text(json.dumps(needle) + "\n")
    request = ProfileRequest(probes=["retrieval"], lengths=[300], depths=[0.5], out_dir=tmp_path,
                             needle_files={"retrieval": path})
    result = run_profile(smollm2, request)
    assert result.failures and "none of the 1 trials passed" in result.failures[0]
    assert not (tmp_path / "smollm2-135m.retrieval.json").exists()
    assert len((tmp_path / "smollm2-135m.retrieval.trials.jsonl").read_text().splitlines()) == 2
