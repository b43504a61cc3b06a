"""The lines ``headprobe profile`` ends on: the top heads with their intervals, and next commands that run."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
from headprobe_cli.main import main
from headprobe_cli.profile_summary import head_lines, summary_lines

import headprobe

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "profiles"


def _with_intervals(tmp_path: Path) -> Path:
    prof = headprobe.Profile.load(SHIPPED / "smollm2-135m.retrieval_reasoning.json")
    scores = np.asarray(prof.query_heads)
    intervals = {"method": "bootstrap", "resamples": 10, "level": 0.9, "seed": 0, "trials": 5,
                 "low": (scores * 0.5).tolist(), "high": np.minimum(scores * 1.5, 1.0).tolist(),
                 "top_k_jaccard": {"10": 0.8}}
    return replace(prof, intervals=intervals).save(tmp_path / "m.retrieval_reasoning.json")


def test_the_top_heads_are_the_largest_scores_with_their_intervals(tmp_path):
    path = _with_intervals(tmp_path)
    prof = headprobe.Profile.load(path)
    scores = np.asarray(prof.query_heads)
    cells = head_lines(prof, top=3)
    layer, head = np.unravel_index(np.argmax(scores), scores.shape)
    low, high = np.asarray(prof.intervals["low"]), np.asarray(prof.intervals["high"])
    assert cells[0] == (f"L{layer}.H{head} {scores[layer, head]:.3f} [{low[layer, head]:.3f}, "
                        f"{high[layer, head]:.3f}] (90% interval)")
    shown = [float(c.split()[1]) for c in cells]
    assert shown == sorted(shown, reverse=True) and len(cells) == 3
    assert shown[-1] == round(float(np.sort(scores, axis=None)[-3]), 3)


def test_the_next_commands_run_as_printed(tmp_path, monkeypatch, capsys):
    heads = _with_intervals(tmp_path)
    layers = tmp_path / "m.layer_retention.json"
    layers.write_bytes((SHIPPED / "smollm2-135m.layer_retention.json").read_bytes())
    lines = summary_lines([heads, layers])
    commands = [line.split("#")[0].strip() for line in lines if line.strip().startswith("headprobe ")]
    assert any("allocate" in c and str(heads) in c for c in commands)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        argv = shlex.split(command)[1:]
        if argv[0] in ("allocate", "plot"):
            assert main(argv) == 0, command
    assert headprobe.BudgetMap.load(tmp_path / "budget.json").total > 0
    assert headprobe.BudgetMap.load(tmp_path / "layers.json").total > 0
    capsys.readouterr()


def test_profiles_in_the_default_folder_need_not_be_named(tmp_path):
    path = _with_intervals(tmp_path)
    lines = summary_lines([path], default_dir=tmp_path)
    assert "  headprobe allocate --beta 1.01 -o budget.json" in [line.split("#")[0].rstrip() + "" for line in lines]
    assert summary_lines([]) == []
