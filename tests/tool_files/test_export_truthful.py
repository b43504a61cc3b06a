"""Exports write only what their readers accept, and say what they hold: a HeadKV export of a profile with a
negative head score is refused (allocate, eval and the DuoAttention export refuse that profile too), one
within the noise of imported learned gates loads with headprobe's importer and allocates; a binary
DuoAttention export says, on its printed line and in ``config.json``, that DuoAttention's ``--sparsity``
gives its heads at the exported sparsity only."""

from __future__ import annotations

import json

import numpy as np
from headprobe_cli.main import main

import headprobe as hp
from headprobe.paths import shipped_profiles_dir

SMOL_R = shipped_profiles_dir() / "smollm2-135m.retrieval.json"


def _profile_with(tmp_path, score: float):
    """The shipped SmolLM2 retrieval profile with query head (0, 0) scored ``score``."""
    obj = json.loads(SMOL_R.read_text())
    obj["scores"]["query_heads"][0][0] = score
    path = tmp_path / f"p{score}.json"
    path.write_text(json.dumps(obj))
    return path


def test_a_negative_score_is_not_exported_to_headkv(tmp_path, capsys):
    out = tmp_path / "Meta-Llama-3-8B-Instruct_retrieval_heads.json"
    assert main(["export", str(_profile_with(tmp_path, -1.0)), "--to", "headkv", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("headprobe: error: retrieval profile of HuggingFaceTB/SmolLM2-135M-"
                                              "Instruct: field 'scores.query_heads[0][0]': expected a score of at "
                                              "least 0, found -1.0; not exported")
    assert not out.exists()


def test_a_headkv_export_loads_with_the_importer_and_allocates(tmp_path, capsys):
    out = tmp_path / "smol_heads.json"
    assert main(["export", str(_profile_with(tmp_path, -1e-4)), "--to", "headkv", "-o", str(out)]) == 0
    imported = hp.import_file(out, model="smollm2-135m")
    assert imported.query_heads[0][0] == -1e-4
    budget = hp.allocate("headkv", [imported], capacity=64, window=8)
    assert np.asarray(budget.budgets).min() >= 0


def _sparsify(heads: np.ndarray, sparsity: float, seed: int) -> frozenset:
    """DuoAttention's sparsify_attention_heads (restated): noise below 1e-6, the heads at or above the quantile."""
    noisy = heads + np.random.default_rng(seed).uniform(0, 1e-6, heads.shape)
    return frozenset(zip(*np.nonzero(noisy >= np.quantile(noisy, sparsity))))


def test_a_binary_export_says_it_holds_at_its_own_sparsity_only(tmp_path, capsys):
    out = tmp_path / "bin"
    assert main(["export", str(SMOL_R), "--to", "duoattention", "--full-share", "0.25", "--binary",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    own = config["sparsity"]
    note = (f"1/0 values: DuoAttention's --sparsity (sparsify_attention_heads) gives these full heads at sparsity "
            f"{own!r} only; at any other sparsity it picks among the tied 1s or 0s at random")
    assert note in printed and config["headprobe"]["note"].startswith(note)
    assert config["headprobe"]["sparsities"] == [own]
    heads = np.loadtxt(out / "full_attention_heads.tsv", delimiter="\t")
    assert len({_sparsify(heads, own, s) for s in range(20)}) == 1           # what the note promises
    assert len({_sparsify(heads, 0.5, s) for s in range(20)}) > 1            # and what it warns about
    ranked = tmp_path / "ranked"
    assert main(["export", str(SMOL_R), "--to", "duoattention", "--full-share", "0.25", "-o", str(ranked)]) == 0
    assert "1/0 values" not in capsys.readouterr().out
    config = json.loads((ranked / "config.json").read_text())
    assert config["headprobe"]["sparsities"] == "any" and "note" not in config["headprobe"]
    heads = np.loadtxt(ranked / "full_attention_heads.tsv", delimiter="\t")
    assert len({_sparsify(heads, 0.5, s) for s in range(20)}) == 1
