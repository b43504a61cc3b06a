"""``headprobe tune`` and the budget-map settings on the command line: every refusal is one line, before the
model loads; the command runs end to end on the tiny model; ``generate --setting``."""

from __future__ import annotations

import json

import pytest
from headprobe_cli.main import main

from headprobe.models import loading

FAST = ["--lengths", "200", "--depths", "50", "--needle-ids", "r01", "r02", "r03", "--max-new-tokens", "2",
        "--no-chat-template", "--policies", "snapkv", "--allocations", "uniform", "pyramid",
        "--values", "window=8", "kernel_size=7", "pooling=max", "taper=20", "--presets", "full", "snapkv[window=8]"]


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: a refusal must come before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", refuse)


def _refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headprobe: error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("args, message", [
    (["--policies", "full"], "--policies full: reads no budget; expected some of"),
    (["--allocations", "nosuch"], "--allocations nosuch: expected some of headkv"),
    (["--head-kinds", "layer_retention"], "--head-kinds layer_retention: expected some of retrieval"),
    (["--values", "bogus=1"], "--values bogus: no searched policy or allocation has option 'bogus'"),
    (["--values", "window"], "--values window: expected KEY=V1[,V2,...]"),
    (["--values", "kernel_size=4"], "--values kernel_size=4: policy snapkv: kernel_size 4: expected an odd"),
    (["--values", "taper=1"], "--values taper=1: --taper 1: expected a number larger than 1"),
    (["--keep-selections", "0"], "--keep-selections 0: expected 1 or more"),
    (["--eta", "1"], "--eta 1: expected an integer of 2 or more"),
    (["--capacities", "0"], "--capacities 0: expected a whole number of tokens"),
    (["--capacities", "64", "64"], "--capacities 64 64: a capacity given twice"),
    (["--cache-share", "5%"], "--cache-share needs --context N"),
    (["--context", "4000"], "--context goes with --cache-share or --cache-bytes"),
    (["--cache-share", "150%", "--context", "4000"], "--cache-share 150%: expected a share of the full cache"),
    (["--cache-bytes", "1KB", "--context", "4000"], "--cache-bytes 1000: one token per KV head already allocates"),
    (["--holdout-ids", "r09"], "--holdout-ids r09: not an item of the task"),
    (["--holdout-ids", "r01", "r02", "r03"], "--holdout-ids: holds every item; leave some to search on"),
    (["--holdout-share", "1.5"], "--holdout-share 1.5: expected a share between 0 and 1"),
    (["--presets", "nosuch"], "--presets nosuch: unknown policy 'nosuch' and no such preset"),
    (["--max-candidates", "1"], "--max-candidates 1: the space has 1 selections and up to 4 allocation-stage"),
    (["--plot", "x.jpg"], "x.jpg: plot format must be one of"),
])
def test_bad_input_is_refused_in_one_line_before_the_model_loads(args, message, capsys, no_model, tiny_dir, tmp_path):
    argv = ["tune", "--model", str(tiny_dir), *FAST, "--out", str(tmp_path / "t.json"), *args]
    assert message in _refused(capsys, argv)


def test_an_output_path_a_setting_cannot_name_is_refused(capsys, no_model, tiny_dir, tmp_path):
    argv = ["tune", "--model", str(tiny_dir), *FAST, "--out", str(tmp_path / "a,b.json")]
    assert "a,b.c64.budget.json could not be named in a setting (its path holds [ ] , @ or :)" in _refused(capsys, argv)


def test_a_single_item_is_refused(capsys, no_model, tiny_dir, tmp_path):
    argv = ["tune", "--model", str(tiny_dir), *FAST, "--needle-ids", "r01", "--out", str(tmp_path / "t.json")]
    assert "tune needs at least two items (one to search on, one held out); the task has 1" in _refused(capsys, argv)


def test_outputs_are_never_replaced_without_force(capsys, no_model, tiny_dir, tmp_path):
    out = tmp_path / "t.json"
    out.write_text("{}")
    base = ["tune", "--model", str(tiny_dir), *FAST, "--out", str(out)]
    assert f"{out} exists; pass --force to overwrite it" in _refused(capsys, base)
    out.unlink()
    (tmp_path / "t.c64.budget.json").write_text("{}")
    assert "t.c64.budget.json exists; pass --force" in _refused(capsys, base)
    (tmp_path / "t.c64.budget.json").unlink()
    runs = tmp_path / "t.runs"
    runs.mkdir()
    (runs / "selection-r0.json").write_text("{}")
    assert "t.runs: a tune run's eval logs are there; pass --resume to continue it or --force" in _refused(capsys,
                                                                                                          base)


def test_the_command_runs_resumes_and_its_setting_runs_in_eval_and_generate(tiny_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    argv = ["tune", "--model", str(tiny_dir), *FAST, "--capacities", "16", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "capacity 16: chosen" in printed and f"wrote {out}" in printed
    report = json.loads(out.read_text())
    assert report["format"] == "headprobe.tune" and report["version"] == 1
    from headprobe.tune.split import hash_order

    held = report["split"]["holdout"]
    assert len(held) == 1 and report["split"]["holdout_share"] == 0.3 and report["split"]["seed"] == 0
    assert report["split"]["calibration"] == [i for i in hash_order(["r01", "r02", "r03"]) if i not in held]
    string = report["capacities"][0]["chosen"]["setting_string"]
    assert string.startswith("snapkv:") and "t.c16.budget.json[window=8,kernel_size=7,pooling=max]" in string
    # a second run refuses; --resume runs nothing again and writes the same choice
    assert main(argv) == 2
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    again = json.loads(out.read_text())
    assert again["capacities"][0]["chosen"] == report["capacities"][0]["chosen"]
    assert again["cost"]["trials"] == report["cost"]["trials"] and again["cost"]["resumed"] is True
    capsys.readouterr()
    # the setting string runs in eval beside a preset, and in generate
    ev = tmp_path / "e.json"
    assert main(["eval", "--model", str(tiny_dir), "--settings", string, "snapkv[window=8]", "--capacities", "16",
                 "--lengths", "200", "--depths", "50", "--needle-ids", "r01", "--max-new-tokens", "2",
                 "--no-chat-template", "--out", str(ev), "--plot", "none"]) == 0
    labels = [s["label"] for s in json.loads(ev.read_text())["settings"]]
    assert labels == [f"{string}@16", "snapkv[window=8]@16"]
    capsys.readouterr()
    assert main(["generate", "--model", str(tiny_dir), "--setting", string, "--max-new-tokens", "2", "--no-chat",
                 "The river ran past the old mill."]) == 0
    assert "cache:" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--policy", "streaming"], ("--setting snapkv[window=8]@16: it names the policy, its options and the budget; "
                                "drop --policy")),
    (["--capacity", "16"], "drop --capacity"),
])
def test_generate_setting_refuses_the_flags_it_replaces(extra, message, capsys, no_model, tiny_dir):
    argv = ["generate", "--model", str(tiny_dir), "--setting", "snapkv[window=8]@16", *extra, "x"]
    assert message in _refused(capsys, argv)


@pytest.mark.parametrize("setting, message", [
    ("snapkv[window=8]", "--setting snapkv[window=8]: give its capacity after @ (e.g. snapkv[window=8]@64)"),
    ("snapkv[window=question]@64", "window=question needs a prompt whose question the eval harness placed"),
    ("snapkv:nosuch.json", "--setting snapkv:nosuch.json: budget map 'nosuch.json': no such file"),
])
def test_generate_setting_refusals(setting, message, capsys, no_model, tiny_dir):
    argv = ["generate", "--model", str(tiny_dir), "--setting", setting, "x"]
    assert message in _refused(capsys, argv)
