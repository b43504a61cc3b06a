"""Reuse mode: with every token recomputed it is exact fast mode; its pieces (alignment, selective attention,
branches, fresh keys) do what the approximate mode relies on; runs record what they were."""

from __future__ import annotations

import json

import conftest
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

import headprobe
from headprobe.attention.rope_shift import decoder_of, layer_rotation
from headprobe.attention.selective import KeyLayout, grouped_masked_attention, masked_rows
from headprobe.haystack.context import build_context, common_prefix_length
from headprobe.haystack.corpus import Haystack, load_haystack
from headprobe.haystack.needles import Needle
from headprobe.models.cache_argument import with_cache
from headprobe.probes.needle_pass import REASONING, RETRIEVAL
from headprobe.probes.probe_config import NeedleProbeConfig
from headprobe.probes.selective_prefill import Branches, fresh_kv, plan_reuse
from headprobe.probes.trial_grid import make_grid

TINY_NEEDLES = {
    "t1": Needle(id="t1", kind="retrieval", needle="The magic word for the gate is purple river.",
                 question="What is the magic word for the gate?", answer="purple river"),
    "t2": Needle(id="t2", kind="reasoning", needle="Ana is 70 years old and loves chess. Bo is 9 and loves kites.",
                 question="What does the older person love?", answer="chess", candidates=("kites", "chess"),
                 facts=("Ana is 70 years old and loves chess.", "Bo is 9 and loves kites.")),
}


def _records(lm, haystack, needles, grid, **config) -> dict[str, dict]:
    """The records of ``grid`` run by the runner of ``config["mode"]`` of the pass that reads these needles."""
    records: list[dict] = []
    steps = RETRIEVAL if next(iter(needles.values())).kind == "retrieval" else REASONING
    steps.runner(config["mode"])(lm, {0: haystack}, needles, grid, NeedleProbeConfig(scores=steps.scores, **config),
                                 records.append)
    return {r["trial"]: r for r in records}


def _assert_same_trials(fast: dict, reuse: dict, atol: float = 2e-5) -> None:
    assert fast.keys() == reuse.keys()
    for trial, a in fast.items():
        b = reuse[trial]
        assert b["mode"] == "reuse" and a["mode"] == "fast"
        margins = a["gates"].pop("likelihood_margin", None), b["gates"].pop("likelihood_margin", None)
        assert (a["response"], a["gates"], a["passed"]) == (b["response"], b["gates"], b["passed"]), trial
        if margins[0] is not None:                                 # rounded to 4 decimals in the log
            assert abs(margins[0] - margins[1]) <= 2e-4, trial
        for name, scores in a["scores"].items():
            np.testing.assert_allclose(b["scores"][name], scores, atol=atol, err_msg=f"{trial} {name}")


@pytest.mark.parametrize("make", [conftest.make_tiny_llama, conftest.make_tiny_gemma3])
@pytest.mark.parametrize("needle", ["t1", "t2"])
def test_full_share_equals_fast_mode_tiny(make, needle):
    """Gemma 3's tiny model has a 16-token window: its sliding layers run the windowed path."""
    lm = make()
    haystack = Haystack("tiny", conftest._TINY_TEXT * 8)
    grid = make_grid([needle], [150, 260], [0.0, 0.3, 0.7, 1.0], [0])
    needles = {needle: TINY_NEEDLES[needle]}
    fast = _records(lm, haystack, needles, grid, mode="fast", chat_template=False, gate="likelihood")
    reuse = _records(lm, haystack, needles, grid, mode="reuse", recompute_share=1.0, chat_template=False,
                     gate="likelihood")
    _assert_same_trials(fast, reuse)
    assert any(r["reuse"]["reused"] > 0 for r in reuse.values())       # the haystack after the needle was reused
    assert all(r["reuse"]["recomputed"] == r["reuse"]["reused"] for r in reuse.values())


def test_share_sets_how_many_reused_tokens_are_recomputed(tiny_llama):
    haystack = Haystack("tiny", conftest._TINY_TEXT * 8)
    grid = make_grid(["t1"], [260], [0.0, 0.5], [0])
    fast = _records(tiny_llama, haystack, {"t1": TINY_NEEDLES["t1"]}, grid, mode="fast", chat_template=False)
    for share in (0.0, 0.3):
        reuse = _records(tiny_llama, haystack, {"t1": TINY_NEEDLES["t1"]}, grid, mode="reuse", recompute_share=share,
                         chat_template=False)
        for trial, record in reuse.items():
            assert record["recompute_share"] == share
            assert record["reuse"]["recomputed"] == round(share * record["reuse"]["reused"]) < record["reuse"]["reused"]
            diff = np.abs(np.array(record["scores"]["enhanced_retrieval"])
                          - np.array(fast[trial]["scores"]["enhanced_retrieval"])).max()
            assert diff > 1e-6                                                  # approximate below a share of 1


def test_plan_reuses_only_haystack_tokens_that_line_up(smollm2):
    tok = smollm2.tokenizer
    haystack = load_haystack(None)
    needle = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[0]
    base = build_context(tok, haystack, None, 1000, 0.0)
    for depth in (0.0, 0.4, 1.0):
        ctx = build_context(tok, haystack, needle, 1000, depth)
        shared = min(common_prefix_length(base.input_ids, ctx.input_ids), ctx.needle_span[0], ctx.length - 1)
        plan = plan_reuse(base.input_ids, ctx.input_ids, shared, ctx.needle_span[1], ctx.length)
        assert plan.prefix <= ctx.needle_span[0] and (plan.reused == 0 or plan.reuse_start >= ctx.needle_span[1])
        assert plan.reused == 0 or plan.reuse_end < ctx.length                  # the last prompt token is computed
        for t in range(plan.reuse_start, plan.reuse_end):
            assert ctx.input_ids[t] == base.input_ids[t - plan.shift]
        if depth < 1.0:
            assert plan.reused > 0.5 * (ctx.length - ctx.needle_span[1])
            assert abs(plan.shift - (ctx.needle_span[1] - ctx.needle_span[0])) <= 2


def test_grouped_masked_attention_equals_sdpa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((6, 9), (2, 30), (2, 30)))
    positions = torch.tensor([3, 4, 10, 11, 12, 20, 21, 28, 29])
    for window in (None, 5):
        mask = torch.arange(30)[None] <= positions[:, None]
        if window:
            mask &= positions[:, None] - torch.arange(30)[None] < window
        expected = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
                                                  attn_mask=mask, scale=0.25).transpose(1, 2)
        torch.testing.assert_close(grouped_masked_attention(q, k, v, mask, 0.25), expected, atol=1e-6, rtol=1e-5)


def test_branches_see_the_prompt_and_only_themselves():
    branches = Branches([[5, 6, 7], [8], [9, 10]])            # responses of 3, 1 and 2 tokens
    ids, positions, branch = branches.layout(20)
    assert ids.tolist() == [5, 6, 9] and positions.tolist() == [20, 21, 20] and branch.tolist() == [0, 0, 2]
    assert [branches.step_rows(v) for v in range(3)] == [[0, 1, 2], [0], [0, 3]]
    keys = torch.cat([torch.arange(20), positions])
    layout = KeyLayout(keys, torch.cat([torch.full((20,), -1), branch]), torch.cat([torch.tensor([19]), positions]),
                       torch.cat([torch.tensor([-1]), branch]), 20)
    seen = layout.visible(slice(0, 4), slice(0, 23), None)
    assert seen[0, :20].all() and not seen[0, 20:].any()          # the last prompt token sees the prompt only
    assert seen[1].tolist()[20:] == [True, False, False]           # branch 0, step 1: itself, not branch 2
    assert seen[2].tolist()[20:] == [True, True, False]
    assert seen[3].tolist()[20:] == [False, False, True] and seen[1:, :20].all()
    rows = masked_rows(torch.randn(1, 2, 4, 8), torch.randn(1, 1, 23, 8), seen, 0.3)
    assert (rows[0][:, ~seen] == 0).all()
    torch.testing.assert_close(rows.sum(-1), torch.ones(1, 2, 4))


@pytest.mark.parametrize("make", [conftest.make_tiny_llama, conftest.make_tiny_gemma3])
def test_fresh_kv_equals_the_layers_own_keys_and_values(make):
    lm = make()
    ids = torch.randint(5, lm.model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache()
    with torch.no_grad():
        lm.model(input_ids=ids, **with_cache(lm.model, cache), use_cache=True)
        decoder = decoder_of(lm.model)
        hidden = decoder.embed_tokens(ids)
        keys, values = fresh_kv(decoder.layers[0], hidden, torch.arange(12), layer_rotation(lm.model, 0))
    torch.testing.assert_close(keys, cache.layers[0].keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values, cache.layers[0].values, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_full_share_equals_fast_mode_smollm2(smollm2, one_thread):
    haystack = load_haystack(None)
    for kind, ids in (("retrieval", ["r01", "r02"]), ("reasoning", ["q01", "q02"])):
        needles = {n.id: n for n in headprobe.load_needles(headprobe.shipped_needle_file(kind)) if n.id in ids}
        grid = make_grid(ids, [600], [0.0, 0.5, 1.0], [0])
        fast = _records(smollm2, haystack, needles, grid, mode="fast", gate="likelihood")
        reuse = _records(smollm2, haystack, needles, grid, mode="reuse", recompute_share=1.0, gate="likelihood")
        _assert_same_trials(fast, reuse)


@pytest.mark.slow
def test_reuse_run_records_mode_and_share(smollm2, one_thread, tmp_path, capsys):
    from headprobe_cli.main import main

    request = headprobe.ProfileRequest(probes=["retrieval"], lengths=[500], depths=[0.3, 1.0], out_dir=tmp_path,
                                       mode="reuse", recompute_share=0.05, needle_ids=["r01", "r02"])
    result = headprobe.run_profile(smollm2, request)
    settings, records = headprobe.read_log(result.logs[0])
    assert settings["mode"] == "reuse" and settings["recompute_share"] == 0.05 and "until_stable" not in settings
    assert all(r["mode"] == "reuse" and r["recompute_share"] == 0.05 for r in records)
    profile = headprobe.Profile.load(tmp_path / "smollm2-135m.retrieval.json")
    assert profile.probe["mode"] == "reuse" and profile.probe["recompute_share"] == 0.05
    assert main(["inspect", str(tmp_path / "smollm2-135m.retrieval.json"), str(result.logs[0])]) == 0
    out = capsys.readouterr().out
    assert out.count("mode reuse (recompute share 5%)") == 2
    resumed = headprobe.ProfileRequest(**{**request.__dict__, "recompute_share": 0.1, "resume": True})
    with pytest.raises(headprobe.HeadprobeError, match="recompute_share"):
        headprobe.run_profile(smollm2, resumed)                   # a log never mixes shares
    assert json.loads(result.logs[0].read_text().splitlines()[0])["settings"]["recompute_share"] == 0.05
