"""kvpress' arithmetic, restated from its code, against explain's.

Restated (read, not copied) from NVIDIA/kvpress at 8bb29b9 (pyproject version 0.5.4); each step names its file
and line. kvpress itself is not installed here (it pins an older transformers; see docs/interop.md), so the
presses' steps are run on tensors shaped as kvpress sees them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMOLLM2_IDENTITY

from headprobe.allocation.api import allocate
from headprobe.errors import HeadprobeError
from headprobe.explain.api import explain_budget
from headprobe.explain.engines.kvpress import duo_attention_press, press_allocation
from headprobe.explain.engines.kvpress_presses import (
    PRESSES,
    kvpress_reported_ratio,
    press_kept,
    press_spec,
    pyramid_layer_budget,
    scorer_kept,
)
from headprobe.explain.setting import Setting
from headprobe.explain.sources import DuoPattern, PressSetting
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile
from headprobe.tool_files.duoattention import write_duoattention

REF = next((p / "shared" / "reference" for p in Path(__file__).resolve().parents
            if (p / "shared" / "reference").is_dir()), None)
CONTEXTS = (65, 100, 1000, 4097, 32000)
RATIOS = (0.0, 0.1, 0.25, 0.5, 0.7, 0.75, 0.9, 0.99)


# ---- kvpress' steps, restated ------------------------------------------------------------------------------

def scorer_press_n_kept(keys: torch.Tensor, compression_ratio: float) -> int:
    """kvpress/presses/scorer_press.py:86-95: ratio 0 returns the keys; else topk(n_kept) of the scores."""
    if compression_ratio == 0:                                                       # :86-87
        return keys.shape[2]
    k_len = keys.shape[2]                                                            # :93
    n_kept = int(k_len * (1 - compression_ratio))                                    # :94
    return torch.zeros(keys.shape[:3]).topk(n_kept, dim=-1).indices.shape[-1]       # :95


def pyramid_get_layer_budget(layer_idx: int, num_hidden_layers: int, q_len: int, compression_ratio: float,
                             window_size: int, beta: int) -> int:
    """kvpress/presses/pyramidkv_press.py:67-84 (PyramidKVPress.get_layer_budget)."""
    max_capacity_prompt = window_size + q_len * (1 - compression_ratio)              # :70
    min_num = (max_capacity_prompt - window_size) / beta                            # :72
    max_num = (max_capacity_prompt - window_size) * 2 - min_num                      # :73
    if max_num >= q_len - window_size:                                               # :75-77
        max_num = q_len - window_size
        min_num = (max_capacity_prompt - window_size) * 2 - max_num
    if not (q_len >= max_num >= min_num >= window_size):                             # :79-81
        return round(q_len * (1 - compression_ratio))
    steps = (max_num - min_num) / (num_hidden_layers - 1)                            # :83
    return round(max_num - layer_idx * steps)                                        # :84


def duo_press_attended(head_scores: np.ndarray, head_compression_ratio: float, sink_size: int, recent_size: int,
                       k_len: int) -> tuple[np.ndarray, float]:
    """kvpress/presses/duo_attention_press.py: post_init_from_model (:83-87) and compress (:105-116); returns the
    keys each head still attends to after the masking and the compression_ratio it reports."""
    n_pruned = round(head_scores.size * head_compression_ratio)                      # :83
    streaming_mask = torch.zeros(head_scores.shape, dtype=bool)                     # :84
    if n_pruned > 0:                                                                 # :85-87
        indices = np.argsort(head_scores, axis=None)[:n_pruned]
        streaming_mask[np.unravel_index(indices, head_scores.shape)] = True
    attended = np.zeros(head_scores.shape, dtype=np.int64)
    for layer in range(head_scores.shape[0]):
        keys = torch.zeros(1, head_scores.shape[1], k_len, 1)
        masked_keys = torch.zeros_like(keys[..., 0], dtype=torch.bool)               # :110
        if head_compression_ratio > 0 or k_len > sink_size + recent_size:            # :107
            masked_keys[:, streaming_mask[layer], sink_size:-recent_size] = True     # :111
        attended[layer] = (~masked_keys[0]).sum(-1).numpy()
    ratio = streaming_mask.float().mean().item()                                     # :115
    ratio *= 1 - (sink_size + recent_size) / k_len                                   # :116
    return attended, ratio


# ---- the cases -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n, s in PRESSES.items() if s.kind == "scorer"])
def test_scorer_presses_keep_int_n_times_one_minus_ratio_in_every_head(name):
    spec = press_spec(name)
    for n in CONTEXTS:
        for r in RATIOS:
            theirs = scorer_press_n_kept(torch.zeros(1, 3, n, 4), r)
            assert scorer_kept(n, r) == theirs
            kept = press_kept(spec, spec.options, r, SMOLLM2_IDENTITY, n)
            assert (kept == theirs).all()


def test_pyramidkv_layer_budgets_are_kvpress():
    for layers in (2, 18, 30, 32):
        for n in (64, 65, 200, 1000, 4097, 32000):
            for r in RATIOS[1:]:
                for window in (8, 64):
                    for beta in (1, 2, 20):
                        theirs = [pyramid_get_layer_budget(i, layers, n, r, window, beta) for i in range(layers)]
                        ours = [pyramid_layer_budget(i, layers, n, r, window, beta) for i in range(layers)]
                        assert ours == theirs, (layers, n, r, window, beta)


def test_pyramidkv_rows_shorten_the_cache_layer_by_layer():
    setting = Setting(4096, 2, "bfloat16", 16)
    row = press_allocation(PressSetting("pyramidkv", 0.5, {}), SMOLLM2_IDENTITY, setting)
    per_layer = [pyramid_get_layer_budget(i, 30, 4096, 0.5, 64, 20) for i in range(30)]
    assert row.held[:, 0].tolist() == per_layer and row.frees_memory
    assert row.bytes_prefill == sum(per_layer) * 3 * 2 * 64 * 2 * 2
    assert row.bytes_end == (sum(per_layer) + 30 * 15) * 3 * 2 * 64 * 2 * 2


def test_adakv_masks_and_keeps_the_whole_cache():
    row = press_allocation(PressSetting("adakv", 0.75, {"alpha_safeguard": 0.2}), SMOLLM2_IDENTITY, Setting(1000))
    assert not row.frees_memory and row.tokens("held") == 30 * 3 * 1000
    assert row.tokens("attended") == 30 * 3 * int(1000 * 0.25)
    assert any("each at least 50" in n for n in row.notes)                            # adakv_press.py:65


def test_snapkv_press_needs_a_context_longer_than_its_window():
    row = press_allocation(PressSetting("snapkv", 0.5, {}), SMOLLM2_IDENTITY, Setting(64))
    assert not row.runs and "window_size=64" in row.notes[0]


def _patterns(tmp_path: Path) -> list[tuple[Path, DuoPattern]]:
    out = []
    for p in sorted((REF / "duo-attention").iterdir()) if REF else []:
        from headprobe.explain.sources import read_input
        out.append((p, read_input([p], None).duo))
    folder = tmp_path / "smol"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_duoattention(Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval.json"), folder,
                           full_share=0.25)
    from headprobe.explain.model_shape import model_shape
    from headprobe.explain.sources import read_input
    out.append((folder, read_input([folder], model_shape("smollm2-135m")).duo))
    return out


def test_duo_attention_press_attends_and_reports_what_kvpress_does(tmp_path):
    for folder, duo in _patterns(tmp_path):
        values = duo.clipped
        for ratio in (0.0, 0.25, 0.5, 0.7444444444444445, 0.9):
            for n in (100, 384, 385, 20000):
                theirs, reported = duo_press_attended(values, ratio, duo.sink_size, duo.recent_size, n)
                row = duo_attention_press(duo, ratio, "test", SMOLLM2_IDENTITY if values.shape == (30, 3) else
                                          _identity_of(folder), Setting(n))
                if row.extra["streaming_heads"] and _tied_at_cut(values, round(values.size * ratio)):
                    assert row.attended.sum() == theirs.sum()           # equal values at the cut: the same count
                else:
                    assert (row.attended == theirs).all(), (folder.name, ratio, n)
                assert row.extra["reported_compression_ratio"] == pytest.approx(reported, abs=1e-6)
                assert row.tokens("held") == values.size * n and not row.frees_memory


def _tied_at_cut(values: np.ndarray, k: int) -> bool:
    flat = np.sort(values.ravel())
    return 0 < k < flat.size and flat[k - 1] == flat[k]


def _identity_of(folder: Path):
    from headprobe.explain.sources import read_input
    return read_input([folder], None).model


def test_the_reported_ratio_is_not_the_share_of_the_cache_freed():
    # 128 + 256 of 1000 tokens kept by half the heads: kvpress reports 0.308, and frees nothing
    assert kvpress_reported_ratio(0.5, 128, 256, 1000) == pytest.approx(0.5 * (1 - 384 / 1000))


def test_budget_map_presses_mask_and_per_layer_presses_shorten(tmp_path):
    bm = allocate("headkv", [Profile.load(shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json")],
                  capacity=128)
    ex = explain_budget(bm.save(tmp_path / "map.json"), context=4096)
    mask, per_layer = [e for e in ex.engines if e.engine == "kvpress"]
    assert (mask.attended == ex.budget).all() and mask.tokens("held") == ex.full_tokens()
    per_head = np.asarray(bm.budgets).sum(axis=1)
    assert per_layer.frees_memory and per_layer.tokens("held") == int(per_head.sum())


def test_a_press_that_is_unknown_or_out_of_range_is_refused():
    with pytest.raises(HeadprobeError, match="expected one of"):
        explain_budget(press="nosuch", ratio=0.5, context=100)
    with pytest.raises(HeadprobeError, match=r"ratio=1.0: expected kvpress' compression_ratio in \[0, 1\)"):
        explain_budget(press="snapkv", ratio=1.0, context=100)
    with pytest.raises(HeadprobeError, match="DuoAttentionPress reads a head pattern"):
        explain_budget(press="duo_attention", ratio=0.5, context=100)
    with pytest.raises(HeadprobeError, match="has no option 'window'"):
        explain_budget(press="snapkv", ratio=0.5, context=100, press_options={"window": 4})
