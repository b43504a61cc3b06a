"""``headprobe export`` for the engines: flags in errors, warnings on stderr, the kvpress ratio file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from headprobe_cli.main import main

from headprobe.allocation.api import allocate
from headprobe.paths import shipped_profiles_dir
from headprobe.profile import Profile

SMOL_R2 = str(shipped_profiles_dir() / "smollm2-135m.retrieval_reasoning.json")


def test_duoattention_export_command(tmp_path, capsys):
    assert main(["export", SMOL_R2, "--to", "duoattention", "--threshold", "0.5", "-o", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headprobe: error: --threshold 0.5 makes no KV head full") and err.count("\n") == 1
    assert main(["export", SMOL_R2, "--to", "duoattention", "--full-share", "0.25", "-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "23 full and 67 streaming KV heads; sparsity 0.7444444444444445" in out
    assert (np.loadtxt(tmp_path / "b" / "full_attention_heads.tsv") > 0.5).sum() == 23
    gemma = str(shipped_profiles_dir() / "gemma3-270m.retrieval_reasoning.json")
    assert main(["export", gemma, "--to", "duoattention", "-o", str(tmp_path / "g")]) == 0
    err = capsys.readouterr().err
    assert "headprobe: warning: google/gemma-3-270m has one KV head" in err
    assert "headprobe: warning: DuoAttention's patch supports Llama and Mistral models only" in err


def test_budget_map_exports(tmp_path, capsys):
    bm = allocate("headkv", [Profile.load(SMOL_R2)], capacity=128, window=8, beta=1.2)
    path = str(bm.save(tmp_path / "bm.json"))
    assert main(["export", path, "--to", "duoattention", "--sink-size", "4", "-o", str(tmp_path / "d")]) == 2
    assert "--sink-size 4 differs from the budget map's sink (0)" in capsys.readouterr().err
    assert main(["export", path, "--to", "kvpress-layers", "-o", str(tmp_path / "r.json")]) == 2
    assert "pass --prompt-len" in capsys.readouterr().err
    assert main(["export", path, "--to", "kvpress-layers", "--prompt-len", "500", "-o", str(tmp_path / "r.json")]) == 2
    assert "more than --prompt-len 500" in capsys.readouterr().err
    assert main(["export", path, "--to", "kvpress-layers", "--prompt-len", "4000", "-o", str(tmp_path / "r.json")]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["format"] == "headprobe.kvpress_layer_ratios" and data["prompt_len"] == 4000
    # kvpress keeps int(k_len * (1 - ratio)) tokens a head (ScorerPress / compute_n_kept)
    assert [int(4000 * (1 - r)) for r in data["compression_ratios"]] == data["kept_per_head"]
    assert sum(data["kept_per_head"]) * 3 == bm.total


@pytest.mark.parametrize("kept, n", [(0, 7), (7, 7), (28, 2114), (733, 2114), (1, 3), (128, 4096)])
def test_removal_ratio_is_exact(kept, n):
    from headprobe.tool_files.layer_list import removal_ratio

    r = removal_ratio(kept, n)
    assert int(n * (1 - r)) == kept and 0 <= r <= 1
