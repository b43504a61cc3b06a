"""The eval grid on the real SmolLM2-135M-Instruct: a two-cell grid that finds a needle."""

import pytest

import headprobe
from headprobe.eval.items import items_from_needles
from headprobe.eval.result import EvalResult
from headprobe.eval.runner import EvalRequest, run_eval
from headprobe.eval.settings import expand_settings


@pytest.mark.slow
def test_two_cell_grid_finds_the_needle(smollm2, tmp_path):
    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ["r01"])
    req = EvalRequest(expand_settings(["full", "snapkv"], [128]), items_from_needles(needles), [800], [0.5],
                      headprobe.load_haystack(), {"kind": "needle"}, max_new_tokens=20)
    result = run_eval(smollm2, req, tmp_path / "e.json")
    assert EvalResult.load(tmp_path / "e.json").complete
    full, snap = result.cells
    answer = full["trials"][0]["response"].lower()
    assert "dominoes" in answer and full["accuracy"] >= 0.8, answer
    assert 700 <= full["trials"][0]["prompt_len"] <= 800
    # the compressed cache really is smaller: 128 tokens per KV head of ~800
    assert snap["used_bytes"] < 0.25 * full["used_bytes"]
    assert snap["full_cache_bytes"] == pytest.approx(full["full_cache_bytes"], rel=0.05)   # same prompt, answers differ
