"""``--depths`` is in percent for every command that places needles: ``--depths 1`` is 1 % of the haystack,
never 100 % (values <= 1 were once read as fractions)."""

from __future__ import annotations

import json

import pytest
import torch
from headprobe_cli.main import main

import headprobe
from headprobe.eval.result import EvalResult

torch.set_num_threads(1)


def test_profile_reads_depths_as_percent(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    main(["profile", "--model", str(tiny_dir), "--device", "cpu", "--probe", "retrieval", "--lengths", "600",
          "--depths", "1", "100", "--needles", "r01", "--no-chat-template", "--out-dir", str(out)])
    assert "depths 1%, 100%" in capsys.readouterr().err
    lines = [json.loads(x) for x in (out / f"{tiny_dir.name}.retrieval.trials.jsonl").read_text().splitlines()]
    assert lines[0]["settings"]["depths"] == [0.01, 1.0]
    by_depth = {r["depth"]: r for r in lines[1:]}
    assert set(by_depth) == {0.01, 1.0}
    assert by_depth[0.01]["actual_depth"] < 0.1
    assert by_depth[1.0]["actual_depth"] > 0.9


def test_eval_reads_depths_as_percent(tiny_dir, tmp_path):
    out = tmp_path / "e.json"
    assert main(["eval", "--model", str(tiny_dir), "--settings", "full", "--lengths", "300", "--depths", "1",
                 "--needle-ids", "r01", "--max-new-tokens", "2", "--no-chat-template", "--out", str(out),
                 "--plot", "none"]) == 0
    result = EvalResult.load(out)
    assert result.grid["depths"] == [0.01]
    assert [c["depth"] for c in result.cells] == [0.01]


def test_ablate_reads_depths_as_percent(tiny_dir, tmp_path):
    from conftest import write_random_profile

    lm = headprobe.load_model(str(tiny_dir), device="cpu")
    profile = tmp_path / "tiny.retrieval.json"
    write_random_profile(lm, "retrieval", profile)
    out = tmp_path / "a.json"
    assert main(["ablate", "--model", str(tiny_dir), "--device", "cpu", "--profile", str(profile), "--k", "1",
                 "--lengths", "300", "--depths", "1", "--needle-ids", "r01", "--max-new-tokens", "2",
                 "--no-chat-template", "--out", str(out), "--plot", "none"]) == 0
    assert json.loads(out.read_text())["grid"]["depths"] == [0.01]


@pytest.mark.parametrize("command", ["profile", "eval", "ablate"])
def test_depths_beyond_100_percent_are_refused(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([command, "--depths", "150"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--depths 150.0: expected a percentage between 0 and 100" in err[0]
