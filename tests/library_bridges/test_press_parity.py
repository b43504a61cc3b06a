"""Method parity with kvpress: for the methods both toolkits implement, the tokens each KV head keeps in
headprobe's cache are those kvpress's own press keeps, on the same prompt and ratio, or they differ only
by a documented rule (docs/interop.md, "Method parity with kvpress").

Runs where kvpress is installed (its own environment, ``.ci/kvpress``); the headprobe side runs there too.
"""

from __future__ import annotations

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

import headprobe
from headprobe.library_bridges.press_parity import agreement, full_keys, headprobe_kept, press_kept

pytestmark = pytest.mark.slow

RATIO = 0.5


@pytest.fixture(scope="module")
def smollm2():
    torch.manual_seed(0)
    return headprobe.load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def prompt(smollm2):
    text = headprobe.load_haystack().text[:2400] + " The code of the harbour vault is 4817. "
    ids = smollm2.tokenizer(text + "\nWhat is the code of the harbour vault?", return_tensors="pt").input_ids
    return ids[:, -500:]


@pytest.fixture(scope="module")
def keys(smollm2, prompt):
    return full_keys(smollm2.model, prompt)


def _n_kept(prompt) -> int:
    from kvpress.utils import compute_n_kept

    return compute_n_kept(prompt.shape[1], RATIO)


@pytest.mark.parametrize("name", ["snapkv", "streaming", "keydiff"])
def test_the_same_tokens_are_kept_in_every_head(smollm2, prompt, keys, name):
    """SnapKV (window 32, average pooling of kernel 5, as kvpress's defaults but the window), StreamingLLM
    (4 sinks) and KeyDiff (normalised anchor, the whole prompt in one block) keep exactly kvpress's tokens
    in every KV head of every layer."""
    n = prompt.shape[1]
    press, policy, options = {
        "snapkv": (kvpress.SnapKVPress(RATIO, window_size=32, kernel_size=5), "snapkv",
                   {"window": 32, "kernel_size": 5, "pooling": "avg"}),
        "streaming": (kvpress.StreamingLLMPress(RATIO, n_sink=4), "streaming", {"sink": 4, "window": 0}),
        "keydiff": (kvpress.KeyDiffPress(RATIO), "keydiff", {"block_size": n, "anchor": "normalized"}),
    }[name]
    theirs = press_kept(smollm2.model, press, prompt, keys)
    ours = headprobe_kept(smollm2, prompt, policy, options, capacity=_n_kept(prompt))
    found = agreement(ours, theirs)
    assert found.heads == 30 * 3
    assert found.share == 1.0, found.first_difference
    assert all(len(head) == _n_kept(prompt) for layer in ours for head in layer)


def test_block_keydiff_keeps_kvpress_tokens_where_both_see_the_same_keys(smollm2, prompt, keys):
    """KeyDiff block by block, as its paper prefills: kvpress's ``BlockPress(KeyDiffPress)`` keeps the first
    ``n_kept`` tokens, then adds ``block_size`` at a time and keeps the ``n_kept`` most distinct;
    ``keydiff[block_size=B]`` does the same where ``B`` divides ``n_kept``. In the first layer both score the
    same keys and keep the same tokens in every head. Above it they part by design: headprobe prefills block
    by block for real, so a later layer's keys come from lower layers that already dropped tokens, while
    kvpress scores the keys of one full forward pass."""
    block, n_kept = 50, _n_kept(prompt)
    assert n_kept % block == 0
    press = kvpress.BlockPress(kvpress.KeyDiffPress(RATIO), block_size=block)
    theirs = press_kept(smollm2.model, press, prompt, keys)
    ours = headprobe_kept(smollm2, prompt, "keydiff", {"block_size": block, "anchor": "normalized"}, capacity=n_kept)
    first = agreement(ours, theirs, layers=[0])
    assert (first.heads, first.share) == (3, 1.0), first.first_difference
    above = agreement(ours, theirs, layers=list(range(1, 30)))
    assert above.share < 1.0 and above.same_counts == above.heads     # same sizes, other tokens somewhere
    one_block = headprobe_kept(smollm2, prompt, "keydiff", {"block_size": prompt.shape[1]}, capacity=n_kept)
    assert agreement(ours, one_block).share < 1.0                      # blocks change what is kept


def test_adakv_keeps_kvpress_tokens_up_to_float_ties(smollm2, prompt, keys):
    """AdaKV over SnapKV: with the safeguard counted on the whole budget (``floor_of=budget``, kvpress's
    ``int(n_kept · alpha)`` with the window inside), the kept tokens agree but for near-ties of the one
    top-k over all heads of a layer (float sums in another order): at most one position in a head."""
    press = kvpress.AdaKVPress(kvpress.SnapKVPress(RATIO, window_size=32, kernel_size=5), alpha_safeguard=0.2)
    theirs = press_kept(smollm2.model, press, prompt, keys)
    ours = headprobe_kept(smollm2, prompt, "snapkv", {"window": 32, "kernel_size": 5, "pooling": "avg",
                                                      "adaptive": True, "floor_share": 0.2, "floor_of": "budget"},
                          capacity=_n_kept(prompt))
    found = agreement(ours, theirs)
    assert found.share >= 0.95 and found.jaccard > 0.999, found
    for layer_ours, layer_theirs in zip(ours, theirs, strict=True):
        assert sum(map(len, layer_ours)) == sum(map(len, layer_theirs))          # each layer's total is kept
        for a, b in zip(layer_ours, layer_theirs, strict=True):
            assert len(set(a) ^ set(b)) <= 2


def test_pyramid_differs_from_kvpress_only_by_its_rounding(smollm2, prompt, keys):
    """PyramidKV (window 8, beta 20): headprobe's layer budgets sum exactly to the target and spread the
    remainder over heads (largest remainder); kvpress rounds each layer's budget on its own. The layer
    budgets differ by at most one token per head, and the kept tokens by as much."""
    press = kvpress.PyramidKVPress(RATIO, window_size=8, kernel_size=5, beta=20)
    theirs = press_kept(smollm2.model, press, prompt, keys)
    bm = headprobe.allocate("pyramid", [], smollm2.identity, capacity=_n_kept(prompt), window=0, taper=20)
    ours = headprobe_kept(smollm2, prompt, "snapkv", {"window": 8, "kernel_size": 5, "pooling": "avg"}, budget=bm)
    found = agreement(ours, theirs)
    assert found.jaccard > 0.98, found
    for layer_ours, layer_theirs in zip(ours, theirs, strict=True):
        for a, b in zip(layer_ours, layer_theirs, strict=True):
            assert abs(len(a) - len(b)) <= 1
            assert len(set(a) ^ set(b)) <= 4


QUESTIONS = [
    (" The code of the harbour vault is 4817. ", "What is the code of the harbour vault?"),
    (" The ferry to Marrow Point leaves at twenty past six. ", "When does the ferry to Marrow Point leave?"),
    (" The mascot of the chess club is a stuffed badger named Pimm. ", "What is the chess club's mascot called?"),
]


@pytest.mark.parametrize("needle, question", QUESTIONS)
def test_kvpress_without_a_press_and_headprobes_full_cache_answer_alike(smollm2, needle, question):
    """kvpress's pipeline with no press and headprobe's full cache, on the same tokens (the pipeline's own
    context and question ids, one after the other), give the same greedy answer."""
    from transformers import pipeline

    hay = headprobe.load_haystack().text
    context = hay[:1500] + needle + hay[1500:2600]
    pipe = pipeline("kv-press-text-generation", model=smollm2.model, tokenizer=smollm2.tokenizer)
    theirs = pipe(context, question=question, press=None, max_new_tokens=16)["answer"]
    tokens = pipe.preprocess(context, [question], "", 100_000)
    ids = torch.cat([tokens["context_ids"], tokens["questions_ids"][0]], dim=1)
    ours = headprobe.generate_compressed(smollm2, input_ids=ids, policy="full", max_new_tokens=16)
    assert ours.texts[0].strip() == theirs.strip()
    assert theirs.strip()


def test_duoattention_keeps_kvpress_tokens_in_every_head(smollm2, prompt, keys, tmp_path):
    """DuoAttention from a pattern folder (headprobe's export of SmolLM2's profile, sink 128, recent 256):
    kvpress's DuoAttentionPress (through DuoAttentionFolderPress) masks all but the sink and the recent
    tokens of its streaming heads; headprobe runs the folder converted to a budget map (``explain --to
    budget`` at the prompt's length) with the streaming policy it names. Every head keeps the same tokens."""
    from headprobe_cli.main import main

    from headprobe.library_bridges.kvpress import DuoAttentionFolderPress

    profile = headprobe.newest_profile(smollm2.identity, "retrieval_reasoning").path
    folder, mapped = tmp_path / "duo", tmp_path / "duo_map.json"
    assert main(["export", str(profile), "--to", "duoattention", "-o", str(folder)]) == 0
    n = prompt.shape[1]
    assert main(["explain", str(folder), "--model", "smollm2-135m", "--context", str(n), "--to", "budget",
                 "-o", str(mapped)]) == 0
    bm = headprobe.BudgetMap.load(mapped)
    run = bm.method["run_with"]
    theirs = press_kept(smollm2.model, DuoAttentionFolderPress(pattern_dir=folder), prompt, keys)
    ours = headprobe_kept(smollm2, prompt, run["policy"], run["options"], budget=bm)
    found = agreement(ours, theirs)
    assert found.share == 1.0, found.first_difference
    sizes = {len(head) for layer in ours for head in layer}
    assert sizes == {n, 128 + 256}                 # full heads keep the prompt, streaming heads sink + recent
