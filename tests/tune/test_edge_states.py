"""Tune's edge states: a forced run over an earlier one leaves the old outputs or its own, resumable; a space
that leaves nothing to race, or a ``--values`` value nothing can run with, is refused before the model loads."""

from __future__ import annotations

import pytest
import torch
from headprobe_cli.main import main
from tune.synthetic_scores import install
from tune.test_runner import tiny_request

import headprobe
from headprobe.models import loading
from headprobe.tune.report import write_tune_outputs
from headprobe.tune.runner import run_tune, runs_dir

torch.set_num_threads(1)


def _interrupt_after(monkeypatch, n: int) -> None:
    """Stop the run (as Ctrl-C would) right after its ``n``-th logged cell group."""
    from headprobe.eval import cell_log

    original, calls = cell_log.CellLog.add, {"n": 0}

    def add_then_stop(self, records):
        original(self, records)
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(cell_log.CellLog, "add", add_then_stop)


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_an_interrupted_forced_tune_leaves_the_old_outputs_or_its_own_and_resumes(tiny_llama, tmp_path, monkeypatch):
    install(monkeypatch)
    out = tmp_path / "tune.json"
    old = run_tune(tiny_llama, tiny_request(), out)
    report = write_tune_outputs(tiny_llama, old, out, out.with_suffix(".png"))
    old_files = [out.parent / n for n in report["files"].values()]
    folder = runs_dir(out)
    before = _snapshot(folder)
    other = tiny_request(capacities=(16,))                  # other settings: its eval logs differ from the old ones

    _interrupt_after(monkeypatch, 1)                         # inside the forced run's first eval run
    with pytest.raises(KeyboardInterrupt):
        run_tune(tiny_llama, other, out, force=True)
    assert _snapshot(folder) == before and all(f.exists() for f in old_files)     # the old run is whole

    _interrupt_after(monkeypatch, 4)                         # resumed, it finishes its first eval run, then stops
    with pytest.raises(KeyboardInterrupt):
        run_tune(tiny_llama, other, out, resume=True)
    names = {p.name for p in folder.iterdir()}
    assert "holdout.json" not in names and "selection-r0.json" in names          # its own runs only
    assert not any(f.exists() for f in old_files if f != folder)                  # old report, maps, figure gone
    assert not folder.with_name(folder.name + ".forced").exists()

    monkeypatch.undo()
    install(monkeypatch)
    resumed = run_tune(tiny_llama, other, out, resume=True)
    assert list(resumed.chosen) == [16]
    fresh = run_tune(tiny_llama, other, tmp_path / "fresh" / "tune.json")
    assert {c: s.label for c, s in resumed.chosen.items()} == {c: s.label for c, s in fresh.chosen.items()}


def test_a_forced_run_s_staged_logs_are_not_overwritten_by_a_plain_run(tiny_llama, tmp_path, monkeypatch):
    from headprobe.tune.report import check_tune_outputs

    install(monkeypatch)
    out = tmp_path / "tune.json"
    run_tune(tiny_llama, tiny_request(), out)
    _interrupt_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        run_tune(tiny_llama, tiny_request(capacities=(16,)), out, force=True)
    staged = runs_dir(out).with_name("tune.runs.forced")
    runs_dir(out).rename(tmp_path / "moved")                 # only the forced run's logs are left
    with pytest.raises(headprobe.HeadprobeError, match=f"{staged}: the eval logs of a forced tune run"):
        check_tune_outputs(out, [16], None, resume=False, force=False)


FAST = ["--lengths", "200", "--depths", "50", "--needle-ids", "r01", "r02", "r03", "--max-new-tokens", "2",
        "--no-chat-template", "--presets", "full"]


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "load_model", refuse)


def test_a_space_with_nothing_to_race_is_refused_before_the_model_loads(capsys, no_model, tiny_dir, tmp_path):
    out = tmp_path / "t" / "t.json"
    argv = ["tune", "--model", str(tiny_dir), *FAST, "--policies", "snapkv", "--values", "window=32",
            "--capacities", "16", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headprobe: error: capacity 16: no selection of the space can run (setting snapkv"), err
    assert "smaller than the snapkv window (32 tokens)" in err and "\n" not in err
    assert not (tmp_path / "t").exists()


def test_an_option_value_nothing_can_run_with_is_refused_before_the_model_loads(capsys, no_model, tmp_path):
    out = tmp_path / "t" / "t.json"
    argv = ["tune", *FAST, "--policies", "snapkv", "--allocations", "uniform", "dynamickv", "--values",
            "window=8", "task=bogus,code", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headprobe: error: --values task=bogus: setting snapkv:dynamickv"), err
    assert "task bogus is not in the layer-retention profile (it has code," in err and "\n" not in err
    assert not (tmp_path / "t").exists()


def test_an_option_value_no_runnable_candidate_reads_is_refused(capsys, no_model, tiny_dir, tmp_path):
    """``--values task=...`` on a model with no layer-retention profile: no candidate that can run reads
    ``task``, so the value would be ignored; refused before the model loads, nothing written."""
    out = tmp_path / "t" / "t.json"
    argv = ["tune", "--model", str(tiny_dir), *FAST, "--values", "task=bogus", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headprobe: error: --values task: no candidate of the space reads task (read by "), err
    assert "dynamickv" in err and "\n" not in err
    assert not (tmp_path / "t").exists()


def test_the_library_refuses_resume_and_force_together(tiny_llama, tmp_path):
    with pytest.raises(headprobe.HeadprobeError, match="resume and force: a run either continues its logs"):
        run_tune(tiny_llama, tiny_request(), tmp_path / "t.json", resume=True, force=True)
    assert not any(tmp_path.iterdir())
