"""Published files (../shared/reference): import, allocate, export and import again without loss.

Skips when the reference folder is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from headprobe.allocation.api import allocate
from headprobe.profile import Profile
from headprobe.tool_files.auto import import_file
from headprobe.tool_files.duoattention import read_duoattention, read_tsv, write_duoattention
from headprobe.tool_files.headkv_json import read_headkv_json, write_headkv_json
from headprobe.tool_files.layer_list import read_layer_list, write_layer_list

REF = Path(__file__).resolve().parents[3] / "shared" / "reference"
pytestmark = pytest.mark.skipif(not REF.is_dir(), reason=f"{REF} not present")

HEADKV = sorted((REF / "headkv").glob("*.json")) if REF.is_dir() else []
SCORE_FILES = HEADKV + (sorted((REF / "retrieval-head").glob("*.json")) if REF.is_dir() else [])
DUO = sorted(p for p in (REF / "duo-attention").iterdir() if p.is_dir()) if REF.is_dir() else []
LLAMA_R2 = REF / "headkv" / "Meta-Llama-3-8B-Instruct_retrieval_reasoning_heads.json"
MISTRAL_R2 = REF / "headkv" / "Mistral-7B-Instruct-v0.2_retrieval_reasoning_heads.json"


def _means(path: Path) -> np.ndarray:
    raw = json.loads(path.read_text())
    return np.array([np.mean(v) for v in raw.values()]).reshape(32, 32)


@pytest.mark.parametrize("path, top, largest", [(LLAMA_R2, (15, 30), 1273), (MISTRAL_R2, (18, 0), 1354)])
def test_compat_headkv_reproduces_published_arithmetic(path, top, largest):
    prof = read_headkv_json(path)
    assert prof.kind == "retrieval_reasoning" and prof.model.num_kv_heads == 8
    bm = allocate("headkv", [prof], capacity=128, window=8, beta=1.5, compat="headkv")
    b = np.array(bm.budgets) - 8
    assert bm.granularity == "query_head" and b.shape == (32, 32)
    assert b.min() == 40 and b.max() == largest
    assert np.unravel_index(b.argmax(), b.shape) == top
    # independent restatement of HeadKV's init_headkv on the raw file
    m = _means(path)
    share = m / sum(m.ravel().tolist())
    ref = np.round(share * ((120 // 1.5) * 1024) + (120 - 120 // 1.5)).astype(int)
    assert np.array_equal(b, ref)


def test_compat_and_kv_head_mode_differ_where_headkv_wastes_memory():
    prof = read_headkv_json(LLAMA_R2)
    compat = allocate("headkv", [prof], capacity=128, window=8, beta=1.5, compat="headkv")
    ours = allocate("headkv", [prof], capacity=128, window=8, beta=1.5)
    # HeadKV's arithmetic, restated: each query head gets round(share * pool + floor) plus the window, so
    # the total drifts from 128 per head by the rounding; the drift is exact and known in advance
    m = _means(LLAMA_R2)
    share = m / sum(m.ravel().tolist())
    expected = np.round(share * ((120 // 1.5) * 1024) + (120 - 120 // 1.5)).astype(int) + 8
    assert np.array_equal(np.array(compat.budgets), expected)
    assert compat.total == int(expected.sum()) and compat.total != 128 * 1024
    assert ours.total == 128 * 256 and np.array(ours.budgets).shape == (32, 8)
    assert min(map(min, ours.budgets)) >= 48


@pytest.mark.parametrize("path", SCORE_FILES, ids=lambda p: p.name)
def test_score_json_round_trip(path, tmp_path):
    prof = read_headkv_json(path)
    raw = json.loads(path.read_text())
    assert np.array_equal(np.array(prof.query_heads), np.array([np.mean(v) for v in raw.values()]).reshape(32, 32))
    # through the headprobe profile file and back out to the published format
    prof = Profile.load(prof.save(tmp_path / "p.json"))
    out = write_headkv_json(prof, tmp_path / "out.json")
    text = out.read_text()
    assert text.count("\n") == 1
    exported = json.loads(text)
    assert list(exported) == list(raw)  # every key, layer-major, same order
    again = read_headkv_json(out, model=prof.model.name, kind=prof.kind)
    assert again.query_heads == prof.query_heads
    for beta in (1.01, 1.5):
        a = allocate("headkv", [prof], beta=beta, compat="headkv").budgets
        assert allocate("headkv", [again], beta=beta, compat="headkv").budgets == a
        assert allocate("headkv", [again], beta=beta).budgets == allocate("headkv", [prof], beta=beta).budgets
    with pytest.raises(Exception, match="exists; pass force=True"):
        write_headkv_json(prof, out)


@pytest.mark.filterwarnings("ignore:the split runs through")
@pytest.mark.parametrize("folder", DUO, ids=lambda p: p.name)
def test_duoattention_round_trip(folder, tmp_path):
    prof = read_duoattention(folder)
    orig = read_tsv(folder / "full_attention_heads.tsv")
    assert prof.model.num_kv_heads == orig.shape[1] == 8 and prof.probe["source"] == "duoattention"
    assert np.array_equal(np.array(prof.kv_heads), orig)
    prof = Profile.load(prof.save(tmp_path / "p.json"))
    # exact export: same numbers, same config
    out = write_duoattention(prof, tmp_path / "exact", exact=True)
    assert np.array_equal(read_tsv(out / "full_attention_heads.tsv"), orig)
    assert (out / "full_attention_heads.tsv").read_text() == (folder / "full_attention_heads.tsv").read_text()
    assert json.loads((out / "config.json").read_text()) == json.loads((folder / "config.json").read_text())
    # default export: [0, 1], no ties, same order as the original (clipped to [0, 1] as DuoAttention
    # reads it) wherever it was strict
    out = write_duoattention(prof, tmp_path / "ranked")
    ranked = read_tsv(out / "full_attention_heads.tsv")
    assert ranked.min() >= 0 and ranked.max() <= 1 and len(np.unique(ranked)) == ranked.size
    assert (orig == 1.0).sum() > 1  # the published file does have ties
    o, r = np.clip(orig, 0, 1).ravel(), ranked.ravel()
    i, j = np.triu_indices(o.size, 1)
    strict = o[i] != o[j]
    assert np.all(np.sign(o[i] - o[j])[strict] == np.sign(r[i] - r[j])[strict])
    # split at the published threshold: the same full heads as the original
    out = write_duoattention(prof, tmp_path / "bin", threshold=0.5, binary=True)
    assert np.array_equal(read_tsv(out / "full_attention_heads.tsv"), (np.clip(orig, 0, 1) >= 0.5) * 1.0)
    out = write_duoattention(prof, tmp_path / "share", full_share=0.25)
    assert (read_tsv(out / "full_attention_heads.tsv") > 0.5).sum() == 64
    # the imported pattern allocates, and its budget map exports to every format
    bm = allocate("headkv", [prof], beta=1.2)
    assert bm.total == 128 * 256
    out = write_duoattention(bm, tmp_path / "from_budget")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["sink_size"], cfg["recent_size"]) == (0, 8)  # the map's sink and window
    lay = read_layer_list(write_layer_list(bm, tmp_path / "layers.json"))
    assert sum(lay["per_layer_total"]) == bm.total and sum(lay["per_head"]) * 8 == bm.total


def test_import_file_detects_formats():
    assert import_file(LLAMA_R2).probe["source"] == "headkv"
    assert import_file(REF / "retrieval-head" / "Mistral-7B-v0.2-hf.json", fmt="retrieval_head").kind == "retrieval"
    assert import_file(DUO[0] / "full_attention_heads.tsv").probe["source"] == "duoattention"
