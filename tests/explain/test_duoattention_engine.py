"""DuoAttention's arithmetic, restated from its code, against explain's.

Restated (read, not copied) from mit-han-lab/duo-attention at fe93c31; each step names its file and line.
Patterns: the published folders in ``shared/reference/duo-attention`` (skipped when absent) and exports of the
shipped profiles (``headprobe export --to duoattention``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from headprobe.explain.api import explain_budget
from headprobe.explain.engines.duoattention import (
    duo_allocation,
    duo_split,
    duo_static_allocation,
    sparsity_streaming,
)
from headprobe.explain.setting import Setting
from headprobe.explain.sources import read_input
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile
from headprobe.tool_files.duoattention import write_duoattention

REF = next((p / "shared" / "reference" for p in Path(__file__).resolve().parents
            if (p / "shared" / "reference").is_dir()), None)
PUBLISHED = sorted(p for p in (REF / "duo-attention").iterdir() if p.is_dir()) if REF else []
SPARSITIES = (0.0, 0.1, 0.25, 0.3, 0.305, 0.5, 0.6, 0.75, 0.9, 0.99, 1.0)


# ---- DuoAttention's steps, restated ------------------------------------------------------------------------

def load_attn_pattern(folder: Path) -> tuple[np.ndarray, int, int]:
    """duo_attn/utils.py:326-336."""
    full_attention_heads = np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t", ndmin=2)
    full_attention_heads = np.clip(full_attention_heads, 0, 1)                      # :332
    config = json.loads((folder / "config.json").read_text())
    return full_attention_heads, config["sink_size"], config["recent_size"]          # :334-336


def sparsify_attention_heads(heads: np.ndarray, sparsity: float, rng: np.random.Generator) -> np.ndarray:
    """duo_attn/utils.py:353-373 (with sparsity given, as every eval script calls it)."""
    heads = heads + rng.uniform(0, 1e-6, heads.shape)                                # :355
    threshold = np.quantile(heads, sparsity)                                         # :360
    if sparsity >= 1:                                                                # :364-366
        threshold = 2
    if sparsity <= 0:                                                                # :367-369
        threshold = -1
    return (heads >= threshold).astype(float)                                        # :371


def tuple_cache_kept(full_attention_heads: np.ndarray, sink_size: int, recent_size: int, tokens: int) -> np.ndarray:
    """The eval patch's cache after ``tokens`` tokens: duo_attn/patch/llama.py:187-193 (a KV head is full when its
    value is above 0.5) and :273-290 (a streaming head longer than sink + recent keeps [:sink] and [-recent:])."""
    out = np.zeros(full_attention_heads.shape, dtype=np.int64)
    for layer, row in enumerate(full_attention_heads):
        full_attn_head_mask = torch.tensor(row) > 0.5                                # :187
        for h, is_full in enumerate(full_attn_head_mask):
            states = torch.arange(tokens)
            if not is_full and states.shape[0] > recent_size + sink_size:            # :273
                recent = states[-recent_size:].clone()                                # :274
                states[sink_size:sink_size + recent_size].copy_(recent)               # :275-277
                states = states[:sink_size + recent_size]                             # :278-280
            out[layer, h] = states.shape[0]
    return out


def static_cache_elements(full_attention_heads: np.ndarray, batch_size: int, max_size: int, sink_size: int,
                          recent_size: int, head_dim: int) -> int:
    """duo_attn/patch/static_kv_cache.py:53-95: per layer, zeros [batch, sink + recent, streaming heads, head_dim]
    and [batch, max_size, full heads, head_dim], for keys and for values."""
    total = 0
    for layer_full_attention_heads in full_attention_heads:
        num_full_kv_head = int((torch.tensor(layer_full_attention_heads) > 0.5).sum().item())   # :54-55
        num_streaming_kv_head = len(layer_full_attention_heads) - num_full_kv_head               # :56
        total += 2 * batch_size * (sink_size + recent_size) * num_streaming_kv_head * head_dim   # :61-77
        total += 2 * batch_size * max_size * num_full_kv_head * head_dim                         # :79-95
    return total


# ---- patterns ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=["smollm2-135m.retrieval_reasoning", "smollm2-135m.retrieval",
                                        *[p.name for p in PUBLISHED]])
def folder(request, tmp_path_factory) -> Path:
    for p in PUBLISHED:
        if p.name == request.param:
            return p
    out = tmp_path_factory.mktemp("duo") / request.param
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_duoattention(Profile.load(shipped_profiles_dir() / f"{request.param}.json"), out, full_share=0.3)
    return out


def _model(folder: Path) -> str | None:
    return None if folder in PUBLISHED else "smollm2-135m"


def _read(folder: Path):
    from headprobe.explain.model_shape import model_shape

    name = _model(folder)
    return read_input([folder], model_shape(name) if name else None)


def test_the_published_patterns_are_there():
    assert REF is None or len(PUBLISHED) == 2


def test_the_raw_cut_is_the_eval_patchs(folder):
    heads, sink, recent = load_attn_pattern(folder)
    inp = _read(folder)
    full, tie = duo_split(inp.duo, None)
    assert tie is None and (inp.duo.sink_size, inp.duo.recent_size) == (sink, recent)
    for n in (100, sink + recent, sink + recent + 1, 5000):
        held = duo_allocation(inp.duo, inp.model, Setting(n), None).held
        assert (held == tuple_cache_kept(heads, sink, recent, n)).all()
    assert (full == (heads > 0.5)).all()


def test_sparsity_streams_the_heads_duoattention_streams(folder):
    """The count of streaming heads is DuoAttention's under every noise draw; which heads, too, except among
    heads of equal value at the cut, where explain takes the lower (layer, head) as full and says so."""
    heads, _, _ = load_attn_pattern(folder)
    inp = _read(folder)
    for s in SPARSITIES:
        full, tie = duo_split(inp.duo, s)
        for seed in range(5):
            theirs = sparsify_attention_heads(heads, s, np.random.default_rng(seed)) > 0.5
            assert theirs.sum() == full.sum(), (s, seed)
            if tie is None:
                assert (theirs == full).all(), (s, seed)
            else:
                value = tie[0]
                assert (theirs[heads != value] == full[heads != value]).all()


def test_the_streaming_count_is_numpys_quantile_cut():
    for n in (1, 2, 3, 18, 90, 256, 1024):
        for s in np.linspace(0, 1, 41):
            values = np.random.default_rng(n).permutation(n) / n          # distinct values in [0, 1)
            assert sparsity_streaming(n, float(s)) == int((sparsify_attention_heads(
                values, float(s), np.random.default_rng(0)) < 0.5).sum()), (n, s)


def test_the_static_cache_allocates_what_duoattention_allocates(folder):
    heads, sink, recent = load_attn_pattern(folder)
    inp = _read(folder)
    setting = Setting(3000, 2, "float16", 20)
    row = duo_static_allocation(inp.duo, inp.model, setting, None)
    elements = static_cache_elements(heads, 2, 3000 + 20, sink, recent, inp.model.head_dim)
    assert row.bytes_prefill == row.bytes_end == elements * 2


def test_explain_on_a_folder_is_duoattention_beside_kvpress_and_the_runtime(folder):
    _heads, sink, recent = load_attn_pattern(folder)
    ex = explain_budget(folder, model=_model(folder), context=20000, sparsity=0.5)
    duo = next(e for e in ex.engines if e.engine == "DuoAttention" and e.setting.startswith("eval patch"))
    assert (ex.budget == duo.held).all()
    assert (ex.engines[0].held == duo.held).all()                       # headprobe's runtime, streaming policy
    assert ex.run_with == {"policy": "streaming", "options": {"sink": sink}}
    assert ex.budget_map.method["window"] == recent and ex.budget_map.method["sink"] == sink
    press = next(e for e in ex.engines if e.engine == "kvpress")
    assert press.tokens("held") == ex.full_tokens() and not press.frees_memory


def test_a_short_context_keeps_everything(folder):
    ex = explain_budget(folder, model=_model(folder), context=300, sparsity=0.9)
    assert (ex.budget == 300).all()
    assert any("nothing is dropped" in n for n in ex.notes)
