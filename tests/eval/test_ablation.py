"""Head ablation masks exactly the heads named: their attention is uniform, every other head unchanged."""

import numpy as np
import pytest
import torch

from headprobe import HeadprobeError
from headprobe.eval.ablation import HeadAblation, random_heads, top_heads

torch.set_num_threads(1)


def _attentions(model, ids, heads):
    with HeadAblation(model, heads, return_weights=True), torch.no_grad():
        return model(ids, output_attentions=True).attentions


def _ids(lm, n=24):
    torch.manual_seed(1)
    return torch.randint(3, lm.model.config.vocab_size, (1, n))


def _uniform(n, sliding=None):
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    visible = k <= q
    if sliding:
        visible &= k > q - sliding
    return visible.float() / visible.sum(-1, keepdim=True)


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gemma3"])
def test_masked_heads_get_uniform_attention(fixture, request):
    lm = request.getfixturevalue(fixture)
    model, ids = lm.model, _ids(lm)
    cfg = model.config
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    heads = [(0, 1), (2, 3), (2, 0), (3, 2)]
    abl = _attentions(model, ids, heads)
    for layer, head in heads:
        sliding = cfg.sliding_window if types[layer] == "sliding_attention" else None
        torch.testing.assert_close(abl[layer][0, head], _uniform(ids.shape[1], sliding))


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gemma3"])
def test_only_the_named_heads_change(fixture, request):
    """Mask heads of the last layer: every head of every layer sees the same inputs, so all others match."""
    lm = request.getfixturevalue(fixture)
    model, ids = lm.model, _ids(lm)
    last = model.config.num_hidden_layers - 1
    heads = [(last, 1), (last, 3)]
    base, abl = _attentions(model, ids, []), _attentions(model, ids, heads)
    for layer in range(last + 1):
        for head in range(model.config.num_attention_heads):
            if (layer, head) in heads:
                assert not torch.allclose(abl[layer][0, head], base[layer][0, head])
                torch.testing.assert_close(abl[layer][0, head], _uniform(ids.shape[1]))
            else:
                torch.testing.assert_close(abl[layer][0, head], base[layer][0, head], rtol=0, atol=0)
    # and the weights of the unmasked run are the model's own attention (eager reference)
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            ref = model(ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("sdpa")
    for layer in range(last + 1):
        torch.testing.assert_close(base[layer], ref[layer], atol=1e-5, rtol=1e-4)


def test_sdpa_path_matches_the_eager_weights_path(tiny_llama):
    model, ids = tiny_llama.model, _ids(tiny_llama)
    heads = [(1, 0), (3, 2)]
    with HeadAblation(model, heads), torch.no_grad():
        fast = model(ids).logits
    with HeadAblation(model, heads, return_weights=True), torch.no_grad():
        eager = model(ids).logits
    torch.testing.assert_close(fast, eager, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        stock = model(ids).logits
    assert not torch.allclose(fast, stock, atol=1e-4)
    with HeadAblation(model, []), torch.no_grad():
        none = model(ids).logits
    torch.testing.assert_close(none, stock, atol=1e-5, rtol=1e-5)
    assert model.config._attn_implementation == "sdpa"   # restored after the block


def test_generate_under_ablation_keeps_causality(tiny_llama):
    """Decoding with a cache (one query row over many keys) gives the same tokens as recomputing every step."""
    model, ids = tiny_llama.model, _ids(tiny_llama, 16)
    heads = [(0, 0), (1, 3)]
    with HeadAblation(model, heads), torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        seq = ids
        for _ in range(6):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert out.tolist() == seq.tolist()


def test_head_selection():
    scores = np.zeros((4, 3))
    scores[2, 1], scores[0, 2], scores[3, 0] = 0.9, 0.5, 0.5
    assert top_heads(scores, 3) == [(2, 1), (0, 2), (3, 0)]
    rnd = random_heads((4, 3), 5, seed=1, exclude=top_heads(scores, 3))
    assert len(set(rnd)) == 5 and not set(rnd) & {(2, 1), (0, 2), (3, 0)}
    assert rnd == random_heads((4, 3), 5, seed=1, exclude=top_heads(scores, 3))
    with pytest.raises(HeadprobeError, match="more heads"):
        random_heads((2, 2), 5)


def test_heads_outside_the_model_are_refused(tiny_llama):
    with pytest.raises(HeadprobeError, match="head 9-0: outside the model"):
        HeadAblation(tiny_llama.model, [(9, 0)])


def test_interrupted_ablation_resumes_without_redoing_a_run(tiny_llama, tmp_path, monkeypatch):
    from conftest import write_random_profile

    import headprobe
    from headprobe.eval import ablation
    from headprobe.profile import Profile

    scores = write_random_profile(tiny_llama, "retrieval", tmp_path / "p.json")
    profile = Profile.load(tmp_path / "p.json")
    items = headprobe.items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:1])
    args = (tiny_llama, profile, [2, 3], items, [300], [0.5], headprobe.load_haystack())
    log = tmp_path / "a.runs.jsonl"
    real, calls = ablation.needle_accuracy, []

    def counting(lm, its, ctxs, heads, *rest):
        calls.append(sorted(heads))
        if len(calls) == 4:                  # baseline, top-2, random-2 done; interrupted in top-3
            raise KeyboardInterrupt
        return real(lm, its, ctxs, heads, *rest)

    monkeypatch.setattr(ablation, "needle_accuracy", counting)
    kw = {"max_new_tokens": 3, "chat_template": False, "log_path": log}
    with pytest.raises(KeyboardInterrupt):
        ablation.run_ablation(*args, **kw)
    with pytest.raises(HeadprobeError, match="pass resume=True"):
        ablation.run_ablation(*args, **kw)
    calls.clear()
    result = ablation.run_ablation(*args, resume=True, **kw)
    assert len(calls) == 2                   # only top-3 and random-3 ran
    assert [r["k"] for r in result["rows"]] == [2, 3]
    assert result["rows"][1]["top_heads"] == [f"{l}-{h}" for l, h in top_heads(np.array(scores), 3)]
    monkeypatch.setattr(ablation, "needle_accuracy", real)
    fresh = ablation.run_ablation(*args, max_new_tokens=3, chat_template=False)
    assert fresh["baseline_accuracy"] == result["baseline_accuracy"]
    assert [r["top_accuracy"] for r in fresh["rows"]] == [r["top_accuracy"] for r in result["rows"]]
