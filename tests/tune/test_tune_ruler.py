"""``headprobe tune --task ruler``: the search runs on RULER samples of one seed, the held-out report on
samples of the next seed; refusals before the model loads."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from headprobe_cli import cmd_tune
from headprobe_cli.main import main

from headprobe import HeadprobeError, TuneTask
from headprobe.eval.ruler_generate import RulerGeneration

torch.set_num_threads(1)

needs_generator = pytest.mark.skipif(
    importlib.util.find_spec("long_context_eval") is None or importlib.util.find_spec("wonderwords") is None,
    reason="RULER's generator: pip install 'headprobe[ruler]' && pip install --no-deps nvidia-long-context-eval")


def test_calibration_and_held_out_samples_come_from_two_seeds():
    cal = RulerGeneration(("niah_single_1", "vt"), (1024,), 2, 5)
    task = TuneTask.ruler(cal, RulerGeneration(cal.tasks, cal.lengths, 2, 6))
    assert task.ids == ["s5/niah_single_1/1024/0", "s5/niah_single_1/1024/1", "s5/vt/1024/0", "s5/vt/1024/1",
                        "s6/niah_single_1/1024/0", "s6/niah_single_1/1024/1", "s6/vt/1024/0", "s6/vt/1024/1"]
    assert task.description["generated"]["seed"] == 5 and task.description["holdout_generated"]["seed"] == 6
    with pytest.raises(HeadprobeError, match="another seed than the calibration's"):
        TuneTask.ruler(cal, cal)


@pytest.mark.parametrize("extra, expect", [
    (["--task", "ruler", "--ratios", "0.5"], "--ratios: tune --task ruler generates its samples"),
    (["--task", "ruler", "--holdout-ids", "x"], "--holdout-ids: tune --task ruler generates its samples"),
    (["--task", "needle", "--samples", "3"], "--samples: applies to tune --task ruler only"),
])
def test_refusals_before_the_model_loads(tiny_dir, tmp_path, capsys, monkeypatch, extra, expect):
    monkeypatch.setattr(cmd_tune, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    assert main(["tune", "--model", str(tiny_dir), "--out", str(tmp_path / "t.json"), *extra]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(lines) == 1 and expect in lines[0], lines


@needs_generator
def test_tune_searches_one_seed_and_reports_on_the_next(tiny_dir, tmp_path, capsys):
    out = tmp_path / "t" / "tune.json"
    assert main(["tune", "--model", str(tiny_dir), "--task", "ruler", "--ruler-tasks", "niah_single_1", "--lengths",
                 "1024", "--samples", "2", "--seed", "3", "--capacities", "48", "--policies", "snapkv", "streaming",
                 "--no-preset-candidates", "--presets", "full", "snapkv", "--max-new-tokens", "4",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    text = json.dumps(report)
    assert "s4/niah_single_1/1024/0" in text and "s3/niah_single_1/1024/0" in text
    runs = sorted((out.parent / "tune.runs").glob("*.json"))
    held = [json.loads(p.read_text()) for p in runs if "holdout" in p.name or "held" in p.name]
    assert held, [p.name for p in runs]
    for result in held:           # the held-out runs ask the next seed's samples, scored by RULER's metric
        items = {t["item"] for c in result["cells"] for t in c["trials"]}
        assert items == {"s4/niah_single_1/1024/0", "s4/niah_single_1/1024/1"}
        assert result["task"]["scorer"] == "ruler"
        assert all(t["task"] == "niah_single_1" for c in result["cells"] for t in c["trials"])
