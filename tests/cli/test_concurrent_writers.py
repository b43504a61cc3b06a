"""Two runs writing one output: the result written first stays, the second writer is refused in one line
and exits non-zero, even when both passed their start-up checks before either wrote (profile runs,
merges, eval results, figures, exports). A run that fails leaves no empty output folder behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from headprobe_cli.main import main

import headprobe
from headprobe.eval.cell_log import CellLog, cell_record
from headprobe.probes import run as probe_run
from headprobe.profile import Profile

ROOT = Path(__file__).resolve().parents[2]


def _one_error(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("headprobe: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def _profile_argv(model: Path, *extra: str) -> list[str]:
    return ["profile", "--model", str(model), "--device", "cpu", "--probe", "retrieval", "--lengths", "300",
            "--depths", "0", "100", "--needles", "r01", "--no-chat-template", *extra]


def _theirs(path: Path) -> str:
    """Another run's result at ``path`` (a shipped profile, marked)."""
    obj = json.loads((ROOT / "profiles" / "smollm2-135m.retrieval.json").read_text())
    obj["probe"]["written_by"] = "the other run"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path.read_text()


def test_a_profile_run_does_not_replace_a_profile_merged_while_it_ran(tiny_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "D"
    target = out / "tiny.retrieval.json"
    real = probe_run.profiles_to_write
    written = {}

    def passing_then_merged(settings, records, *args, **kwargs):
        # the random model passes no gate: count every trial as passed, so that the run writes a profile;
        # and let a merge into the same folder finish first
        profiles = real(settings, [{**r, "gates": {**r["gates"], "published": True}} for r in records],
                        *args, **kwargs)
        written["theirs"] = _theirs(target)
        return profiles

    monkeypatch.setattr(probe_run, "profiles_to_write", passing_then_merged)
    assert main(_profile_argv(tiny_dir, "--out-dir", str(out))) == 2
    error = _one_error(capsys)
    assert f"{target} exists; pass --force to overwrite it" in error
    assert target.read_text() == written["theirs"]
    assert (out / "tiny.retrieval.trials.jsonl").exists()                 # the run's trials are kept
    assert main(_profile_argv(tiny_dir, "--out-dir", str(out), "--force")) == 0
    assert Profile.load(target).probe.get("written_by") is None           # --force replaces it


def test_a_resumed_run_replaces_its_own_profile_but_not_one_written_meanwhile(tiny_dir, tmp_path, monkeypatch,
                                                                              capsys):
    out = tmp_path / "D"
    target = out / "tiny.retrieval.json"
    real = probe_run.profiles_to_write

    def passing(settings, records, *args, **kwargs):
        return real(settings, [{**r, "gates": {**r["gates"], "published": True}} for r in records],
                    *args, **kwargs)

    monkeypatch.setattr(probe_run, "profiles_to_write", passing)
    assert main(_profile_argv(tiny_dir, "--out-dir", str(out))) == 0
    assert main(_profile_argv(tiny_dir, "--out-dir", str(out), "--resume")) == 0      # its own: rewritten

    def merged_meanwhile(settings, records, *args, **kwargs):
        profiles = passing(settings, records, *args, **kwargs)
        target.unlink()
        _theirs(target)
        return profiles

    monkeypatch.setattr(probe_run, "profiles_to_write", merged_meanwhile)
    assert main(_profile_argv(tiny_dir, "--out-dir", str(out), "--resume")) == 2
    assert "exists; pass --force to overwrite it" in _one_error(capsys)
    assert Profile.load(target).probe["written_by"] == "the other run"


def test_two_merges_into_one_folder_keep_the_first_result(tmp_path, monkeypatch, capsys):
    import conftest
    from test_output_files import write_shards

    tiny = conftest.make_tiny_llama().identity
    first = write_shards(tiny, tmp_path / "a", 2)
    second = write_shards(tiny, tmp_path / "b", 3)
    out = tmp_path / "SAME"
    real_save = Profile.save
    state = {"raced": False}

    def the_other_merge_finishes_first(self, path, force=False):
        # this merge has checked every output; the other one, started as late, writes before it does
        if not state["raced"]:
            state["raced"] = True
            assert main(["profile", "--merge", *map(str, second), "--out-dir", str(out)]) == 0
        return real_save(self, path, force=force)

    monkeypatch.setattr(Profile, "save", the_other_merge_finishes_first)
    capsys.readouterr()
    assert main(["profile", "--merge", *map(str, first), "--out-dir", str(out)]) == 2
    assert "exists; pass --force to overwrite it (it was written while this run worked" in _one_error(capsys)
    kept = Profile.load(out / "tiny-llama.retrieval.json")
    assert sorted(map(tuple, kept.probe["merged_shards"])) == [(0, 3), (1, 3), (2, 3)]   # the first written


def test_an_eval_result_written_meanwhile_is_refused(tiny_llama, tmp_path):
    out = tmp_path / "e.json"
    settings = headprobe.expand_settings(["full"], [16], {}, tuple(headprobe.POLICIES))
    log = CellLog(tiny_llama, out, {"kind": "needle"}, {"lengths": [300], "depths": [0.0]}, settings, {})
    out.write_text("someone's result")                       # after this run's checks, before its first write
    trial = {"score": 1.0, "cache_bytes": 1, "used_bytes": 1, "full_cache_bytes": 2, "seconds": 0.1, "new_tokens": 1}
    with pytest.raises(headprobe.HeadprobeError, match="e.json exists; pass force=True to overwrite it"):
        log.add([cell_record(settings[0], 300, 0.0, [trial])])
    log.close()
    assert out.read_text() == "someone's result"


def test_an_eval_run_replaces_its_own_result_as_cells_finish(tiny_llama, tmp_path):
    out = tmp_path / "e.json"
    settings = headprobe.expand_settings(["full"], [16], {}, tuple(headprobe.POLICIES))
    trial = {"score": 1.0, "cache_bytes": 1, "used_bytes": 1, "full_cache_bytes": 2, "seconds": 0.1, "new_tokens": 1}
    with CellLog(tiny_llama, out, {"kind": "needle"}, {"lengths": [300], "depths": [0.0, 1.0]}, settings, {}) as log:
        log.add([cell_record(settings[0], 300, 0.0, [trial])])
        log.add([cell_record(settings[0], 300, 1.0, [trial])])      # rewrites its own result
        result = log.finish()
    assert result.complete and len(headprobe.EvalResult.load(out).cells) == 2


def test_a_figure_written_meanwhile_is_refused(tmp_path, monkeypatch, capsys):
    from headprobe.plots import profile_figures

    target = tmp_path / "p.png"
    real_check = profile_figures.check_overwrite

    def check_then_another_plot(path, force, hint=""):
        real_check(path, force, hint)
        Path(path).write_bytes(b"their figure")
        return Path(path)

    monkeypatch.setattr(profile_figures, "check_overwrite", check_then_another_plot)   # the check save_figure makes
    profile = ROOT / "profiles" / "smollm2-135m.retrieval.json"
    assert main(["plot", str(profile), "-o", str(target)]) == 2
    assert "p.png exists; pass --force to overwrite it" in _one_error(capsys)
    assert target.read_bytes() == b"their figure"
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]


@pytest.mark.parametrize("to, name", [("headkv", "x_heads.json"), ("duoattention", "duo")])
def test_an_export_written_meanwhile_is_refused(tmp_path, monkeypatch, capsys, to, name):
    from headprobe.tool_files import duoattention, headkv_json

    target = tmp_path / name
    module = headkv_json if to == "headkv" else duoattention
    real_check = module.check_overwrite

    def check_then_another_export(path, force, hint=""):
        real_check(path, force, hint)
        if to == "headkv":
            Path(path).write_text("theirs")
        else:
            Path(path).mkdir()
            (Path(path) / "full_attention_heads.tsv").write_text("theirs")
        return Path(path)

    monkeypatch.setattr(module, "check_overwrite", check_then_another_export)
    profile = ROOT / "profiles" / "smollm2-135m.retrieval.json"
    assert main(["export", str(profile), "--to", to, "-o", str(target)]) == 2
    assert f"{name} exists; pass --force to overwrite it" in _one_error(capsys)
    kept = target if to == "headkv" else target / "full_attention_heads.tsv"
    assert kept.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == [name]


# ---- a failed run leaves no empty output folder ---------------------------------------------------

@pytest.fixture
def damaged_model(tiny_dir, tmp_path):
    """A copy of the tiny model whose weights file was cut short."""
    import shutil

    folder = tmp_path / "damaged"
    shutil.copytree(tiny_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return folder


def test_a_profile_run_that_fails_to_load_its_model_leaves_no_folder(damaged_model, tmp_path, capsys):
    out = tmp_path / "new" / "out"
    assert main(_profile_argv(damaged_model, "--out-dir", str(out))) == 2
    assert f"--model {damaged_model}: cannot load (" in _one_error(capsys)
    assert not (tmp_path / "new").exists()


def test_an_eval_run_that_fails_to_load_its_model_leaves_no_folder(damaged_model, tmp_path, capsys):
    out = tmp_path / "new" / "e.json"
    argv = ["eval", "--model", str(damaged_model), "--settings", "full", "--capacities", "16", "--lengths", "300",
            "--depths", "0", "--needle-ids", "r01", "--no-chat-template", "--out", str(out)]
    assert main(argv) == 2
    assert "cannot load (" in _one_error(capsys)
    assert not (tmp_path / "new").exists()


def test_a_merge_that_fails_leaves_no_folder(tmp_path, capsys):
    import conftest
    from test_output_files import write_shards

    paths = write_shards(conftest.make_tiny_llama().identity, tmp_path, 2, which=[0])
    out = tmp_path / "new" / "out"
    assert main(["profile", "--merge", *map(str, paths), "--out-dir", str(out)]) == 2
    assert "shard 1/2 not given" in _one_error(capsys)
    assert not (tmp_path / "new").exists()
