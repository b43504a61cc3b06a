"""headprobe's DuoAttention folders read by DuoAttention's and kvpress' own procedures.

The readers below restate, from mit-han-lab/duo-attention (fe93c31) and NVIDIA/kvpress (0.5.5), what
their code does with a pattern folder:

- ``load_attn_pattern``: ``np.loadtxt(tsv, dtype=float, delimiter="\\t")``, clipped to [0, 1];
  ``sink_size`` and ``recent_size`` from ``config.json``.
- ``sparsify_attention_heads(heads, sparsity=s)``: adds ``np.random.uniform(0, 1e-6)`` to every value,
  cuts at ``np.quantile(heads, s)`` and makes the heads at or above it full (``s >= 1``: none; ``s <= 0``:
  all).
- the eval patch (``enable_llama_duo_attention_eval``): per layer, ``torch.tensor(heads[layer])``; a
  KV head is full when its value is above 0.5; the layer's full heads are counted and the tensor sliced.
- kvpress ``DuoAttentionPress``: the ``round(n · head_compression_ratio)`` lowest values (``np.argsort``
  over the flat pattern) are streaming heads; during prefill a streaming head of layer ``l`` masks keys
  ``[sink_size:-recent_size]`` through ``masked_keys[:, streaming_mask[l], sink:-recent]``.

Each test checks that the heads these procedures end up treating as full are the heads headprobe chose.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from headprobe.allocation.api import allocate
from headprobe.errors import HeadprobeError, flag_spelling
from headprobe.models.identity import ModelIdentity
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile, reduce_groups
from headprobe.tool_files.duoattention import read_duoattention, read_tsv, write_duoattention

REF = Path(__file__).resolve().parents[3] / "shared" / "reference" / "duo-attention"
SMOL_R2 = shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json"
GEMMA_R2 = shipped_profiles_dir() / "gemma3-270m.retrieval_reasoning.json"


# ---- the consumers' procedures ------------------------------------------------------------------

def duo_load_attn_pattern(folder: Path) -> tuple[np.ndarray, int, int]:
    heads = np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t")
    heads = np.clip(heads, 0, 1)
    config = json.loads((folder / "config.json").read_text())
    return heads, config["sink_size"], config["recent_size"]


def duo_sparsify(heads: np.ndarray, sparsity: float, rng: np.random.Generator) -> np.ndarray:
    noisy = heads + rng.uniform(0, 1e-6, heads.shape)
    threshold = np.quantile(noisy, sparsity)
    if sparsity >= 1:
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    return noisy >= threshold


def duo_eval_patch_full_heads(heads: np.ndarray) -> list[torch.Tensor]:
    """Per layer, the full-head mask the eval patch builds (it slices the layer's tensor by the count)."""
    out = []
    for layer in range(len(heads)):
        t = torch.tensor(heads[layer], dtype=torch.float32)
        mask = t > 0.5
        n_full = int(mask.sum().item())
        t[:n_full] = 1                       # reorder_full_attn_heads: fails on a 0-d tensor
        out.append(mask)
    return out


def kvpress_streaming_mask(scores: np.ndarray, ratio: float) -> np.ndarray:
    n_pruned = round(scores.size * ratio)
    mask = np.zeros(scores.shape, dtype=bool)
    if n_pruned > 0:
        mask[np.unravel_index(np.argsort(scores, axis=None)[:n_pruned], scores.shape)] = True
    return mask


def kvpress_masked_keys(streaming_mask: torch.Tensor, layer: int, kv_heads: int, k_len: int, sink: int,
                        recent: int) -> torch.Tensor:
    masked = torch.zeros((1, kv_heads, k_len), dtype=torch.bool)
    masked[:, streaming_mask[layer], sink:-recent] = True
    return masked


# ---- what headprobe meant, restated from the scores ----------------------------------------------

def top_heads(scores: np.ndarray, k: int) -> set[tuple[int, int]]:
    """The k best heads by score (negatives as 0), equal scores: the lower (layer, head) first."""
    s = np.maximum(np.asarray(scores, dtype=float), 0)
    cells = sorted((-s[l, h], l, h) for l in range(s.shape[0]) for h in range(s.shape[1]))
    return {(l, h) for _, l, h in cells[:k]}


def as_set(mask: np.ndarray) -> set[tuple[int, int]]:
    return {(int(l), int(h)) for l, h in zip(*np.nonzero(mask))}


def export(source, folder, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return write_duoattention(source, folder, **kw)


@pytest.fixture
def smol_r2() -> Profile:
    return Profile.load(SMOL_R2)


# ---- tests --------------------------------------------------------------------------------------

def test_small_scores_land_on_duoattentions_cut(smol_r2, tmp_path):
    kv = np.array(smol_r2.kv_heads)
    assert kv.max() < 0.1                                     # headprobe's scale, far below 0.5
    out = export(smol_r2, tmp_path / "duo", full_share=0.25)
    heads, _, _ = duo_load_attn_pattern(out)
    want = top_heads(kv, 23)                                  # round half up of 0.25 · 90 = 22.5
    full = duo_eval_patch_full_heads(heads)
    assert {(l, h) for l, m in enumerate(full) for h in range(3) if m[h]} == want
    config = json.loads((out / "config.json").read_text())
    assert config["threshold"] == 0.5 and config["sparsity"] == 67 / 90
    # DuoAttention's ranked path at the recorded sparsity, whatever its noise
    for seed in range(20):
        assert as_set(duo_sparsify(heads, config["sparsity"], np.random.default_rng(seed))) == want
    # kvpress: round(90 · 67/90) = 67 streaming heads, the other 23 full
    assert as_set(~kvpress_streaming_mask(heads, config["sparsity"])) == want


def test_ties_survive_duoattentions_noise_at_any_sparsity(tmp_path):
    ref = REF / "Mistral-7B-Instruct-v0.2"
    if not ref.is_dir():
        pytest.skip(f"{ref} not present")
    prof = read_duoattention(ref)
    orig = np.loadtxt(ref / "full_attention_heads.tsv", delimiter="\t")
    assert (orig == 1).sum() > 100 and (orig < 0).sum() > 0   # ties at 1.0 and learned gates below 0
    raw_noise_sets = {frozenset(as_set(duo_sparsify(np.clip(orig, 0, 1), 0.5, np.random.default_rng(s))))
                      for s in range(20)}
    assert len(raw_noise_sets) > 1                            # the published file: chosen by the noise
    out = export(prof, tmp_path / "duo")
    heads, _, _ = duo_load_attn_pattern(out)
    n = heads.size
    for sparsity in (0.1, 0.25, 0.5, 0.75, 0.9):
        k_full = n - int(np.ceil(sparsity * (n - 1)))         # distinct values: the quantile's count
        want = top_heads(orig, k_full)                        # negatives clipped to 0 as DuoAttention does
        sets = {frozenset(as_set(duo_sparsify(heads, sparsity, np.random.default_rng(s)))) for s in range(20)}
        assert sets == {frozenset(want)}
    # the import's own split is kept: DuoAttention's raw cut makes the same heads full as in the original
    full = duo_eval_patch_full_heads(heads)
    assert {(l, h) for l, m in enumerate(full) for h in range(8) if m[h]} == as_set(np.clip(orig, 0, 1) > 0.5)
    config = json.loads((out / "config.json").read_text())
    assert config["sparsity"] == (np.clip(orig, 0, 1) <= 0.5).sum() / n
    assert config["sink_size"] == 128 and config["recent_size"] == 256


def test_negative_gates_are_clipped_not_rescaled(tmp_path):
    ref = REF / "Mistral-7B-Instruct-v0.2"
    if not ref.is_dir():
        pytest.skip(f"{ref} not present")
    orig = np.loadtxt(ref / "full_attention_heads.tsv", delimiter="\t")
    out = export(read_duoattention(ref), tmp_path / "duo")
    heads, _, _ = duo_load_attn_pattern(out)
    clipped = np.clip(orig, 0, 1)
    # every strict order DuoAttention sees (after its clip) is kept; heads clipped to 0 rank by (layer, head)
    o, r = clipped.ravel(), heads.ravel()
    i, j = np.triu_indices(o.size, 1)
    strict = o[i] != o[j]
    assert np.all(np.sign(o[i] - o[j])[strict] == np.sign(r[i] - r[j])[strict])
    zeros = np.flatnonzero(o == 0)
    assert len(zeros) > 1 and np.all(np.diff(r[zeros]) < 0)   # lower (layer, head) ranks higher
    assert np.diff(np.sort(r)).min() > 5e-6                   # wider than the 1e-6 noise


def test_threshold_on_headprobe_scale_and_refusal(smol_r2, tmp_path):
    with pytest.raises(HeadprobeError, match=r"threshold=0.5 makes no KV head full: the scores run from 0 to 0.05"):
        write_duoattention(smol_r2, tmp_path / "a", threshold=0.5)
    with flag_spelling({}), pytest.raises(HeadprobeError, match=r"--threshold 0.5 makes no KV head full"):
        write_duoattention(smol_r2, tmp_path / "a", threshold=0.5)
    assert not (tmp_path / "a").exists()
    kv = np.array(smol_r2.kv_heads)
    out = export(smol_r2, tmp_path / "b", threshold=0.01)
    heads, _, _ = duo_load_attn_pattern(out)
    want = as_set(kv >= 0.01)
    assert 0 < len(want) < 90
    assert as_set(heads > 0.5) == want
    config = json.loads((out / "config.json").read_text())
    assert config["sparsity"] == (90 - len(want)) / 90 and config["headprobe"]["value"] == 0.01
    for seed in range(5):
        assert as_set(duo_sparsify(heads, config["sparsity"], np.random.default_rng(seed))) == want


def test_binary_export_gives_the_same_heads_at_the_recorded_sparsity(smol_r2, tmp_path):
    out = export(smol_r2, tmp_path / "bin", full_share=0.25, binary=True)
    heads, _, _ = duo_load_attn_pattern(out)
    assert set(np.unique(heads)) == {0.0, 1.0} and heads.sum() == 23
    config = json.loads((out / "config.json").read_text())
    want = top_heads(np.array(smol_r2.kv_heads), 23)
    for seed in range(10):
        assert as_set(duo_sparsify(heads, config["sparsity"], np.random.default_rng(seed))) == want
    assert as_set(~kvpress_streaming_mask(heads, config["sparsity"])) == want


def test_budget_map_export_keeps_the_maps_window(smol_r2, tmp_path):
    bm = allocate("headkv", [smol_r2], capacity=128, window=8, beta=1.2)
    out = export(bm, tmp_path / "duo", full_share=0.5)
    heads, sink, recent = duo_load_attn_pattern(out)
    assert (sink, recent) == (0, 8)                           # the map's sink and window, not 128 / 256
    assert as_set(heads > 0.5) == top_heads(np.array(bm.shares), 45)
    with pytest.raises(HeadprobeError, match=r"recent_size=256 differs from the budget map's window \(8\)"):
        write_duoattention(bm, tmp_path / "x", recent_size=256)
    bm0 = allocate("headkv", [smol_r2], capacity=128, window=0, beta=1.2)
    with pytest.raises(HeadprobeError, match=r"recent_size=0: expected an integer of at least 1"):
        write_duoattention(bm0, tmp_path / "y")
    # what kvpress masks for a streaming head of the exported folder: all but sink + recent
    stream = torch.as_tensor(kvpress_streaming_mask(heads, json.loads((out / "config.json").read_text())["sparsity"]))
    layer = int(np.nonzero(stream.numpy())[0][0])
    masked = kvpress_masked_keys(stream, layer, 3, 500, sink, recent)
    kept = (~masked[0]).sum(-1)
    assert kept[stream[layer]].tolist() == [8] * int(stream[layer].sum())


def test_one_kv_head_model(tmp_path):
    prof = Profile.load(GEMMA_R2)
    with pytest.warns(UserWarning) as caught:
        out = write_duoattention(prof, tmp_path / "duo", full_share=0.5)
    text = " ".join(str(w.message) for w in caught)
    assert "supports Llama and Mistral models only" in text and "one KV head" in text
    assert read_tsv(out / "full_attention_heads.tsv").shape == (18, 1)
    heads, _, _ = duo_load_attn_pattern(out)
    assert heads.shape == (18,)                                # DuoAttention's loader squeezes it...
    with pytest.raises(IndexError):
        duo_eval_patch_full_heads(heads)                       # ...and its patch cannot slice a 0-d tensor
    # kvpress with the squeezed pattern masks nothing; read as [layers][1] it masks the streaming layers
    flat = torch.as_tensor(kvpress_streaming_mask(heads, 0.5))
    assert flat.sum() == 9 and not kvpress_masked_keys(flat, int(torch.nonzero(flat)[0]), 1, 600, 4, 64).any()
    two_d = np.loadtxt(out / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    stream = torch.as_tensor(kvpress_streaming_mask(two_d, 0.5))
    layer = int(torch.nonzero(stream)[0, 0])
    assert kvpress_masked_keys(stream, layer, 1, 600, 4, 64).sum() == 600 - 68
    assert as_set(~stream.numpy()) == top_heads(np.array(prof.kv_heads), 9)


def test_exported_files_are_readable_by_other_users(smol_r2, tmp_path):
    old = os.umask(0o022)
    try:
        out = export(smol_r2, tmp_path / "duo")
    finally:
        os.umask(old)
    for name in ("full_attention_heads.tsv", "config.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644
    old = os.umask(0o027)
    try:
        out = export(smol_r2, tmp_path / "duo2")
    finally:
        os.umask(old)
    assert stat.S_IMODE((out / "config.json").stat().st_mode) == 0o640


def test_gqa_profile_reduction_is_what_is_ranked(tmp_path):
    ident = ModelIdentity(name="m", source="test", architecture="llama", num_layers=2, num_query_heads=4,
                          num_kv_heads=2, head_dim=8, layer_types=("full_attention",) * 2)
    q = [[0.9, 0.0, 0.2, 0.2], [0.1, 0.1, 0.5, 0.0]]
    prof = Profile(kind="retrieval", model=ident, probe={}, trials={"total": 1, "passed": 1}, query_heads=q,
                   kv_heads=reduce_groups(q, 2, "mean"))
    out = export(prof, tmp_path / "mean", full_share=0.5)
    assert as_set(duo_load_attn_pattern(out)[0] > 0.5) == {(0, 0), (1, 1)}      # means 0.45, 0.2 / 0.1, 0.25
    out = export(prof, tmp_path / "max", full_share=0.5, reduction="max")
    assert as_set(duo_load_attn_pattern(out)[0] > 0.5) == {(0, 0), (1, 1)}
    out = export(prof, tmp_path / "sum", full_share=0.25, reduction="sum")
    assert as_set(duo_load_attn_pattern(out)[0] > 0.5) == {(0, 0)}
