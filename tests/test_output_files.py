"""What headprobe writes: merged shard logs are checked and complete, files respect the umask, one writer per
log, portable file names in logs and profiles, no transformers loading bar."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import headprobe
from headprobe import HeadprobeError
from headprobe.files.trial_log import TrialLog, read_log
from headprobe.probes.aggregate import merge_logs
from headprobe.probes.run import merge_profile_logs
from headprobe.probes.trial_grid import make_grid, shard_trials
from headprobe.profile import Profile

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HEADS = 4, 4            # conftest.make_tiny_llama


@pytest.fixture(scope="module")
def tiny_identity():
    import conftest

    return conftest.make_tiny_llama().identity


def needle_settings(identity, shard=None, depths=(0.0, 0.5, 1.0)) -> dict:
    """The settings a retrieval pass of the tiny model records (as probes/run.py writes them)."""
    return {"model": identity.to_json(), "mode": "fast", "chat_template": False, "headprobe_version": "test",
            "group_reduction": "mean", "pass": "retrieval", "probes": ["retrieval", "enhanced_retrieval"],
            "lengths": [300], "depths": list(depths), "seeds": [0],
            "needle_set": {"path": "needles/retrieval.jsonl", "shipped": True, "fingerprint": "f" * 16,
                           "ids": ["r01", "r02"]},
            "haystack": {"name": "headprobe-corpus", "fingerprint": "h" * 16}, "gate": "published",
            "max_new_tokens": 24, "shard": list(shard) if shard else None}


def record(spec, passed=True) -> dict:
    """A trial record whose scores are a known function of the trial (different per head and trial)."""
    base = (spec.depth + 1) * (1 if spec.needle_id == "r01" else 2)
    return {"trial": spec.id, "needle": spec.needle_id, "length": spec.length, "depth": spec.depth,
            "seed": spec.seed, "gates": {"published": passed, "rouge1_recall": 1.0}, "passed": passed,
            "scores": {"retrieval": [[base * (l + 1) / 10 for _ in range(HEADS)] for l in range(LAYERS)],
                       "enhanced_retrieval": [[base * (h + 1) / 100 for h in range(HEADS)] for _ in range(LAYERS)]},
            "seconds": 0.1}


def grid(settings):
    return make_grid(settings["needle_set"]["ids"], settings["lengths"], settings["depths"], settings["seeds"])


def write_shards(identity, folder: Path, n: int, which=None) -> list[Path]:
    """Shard logs i/n of the tiny grid (every shard, or those in ``which``)."""
    paths = []
    for i in range(n) if which is None else which:
        settings = needle_settings(identity, (i, n))
        path = folder / f"tiny.retrieval.shard{i}of{n}.trials.jsonl"
        with TrialLog(path, settings) as log:
            for spec in shard_trials(grid(settings), (i, n)):
                log.append(record(spec))
        paths.append(path)
    return paths


# ---- profile --merge ----------------------------------------------------------------------------

def test_merging_every_shard_gives_the_means_of_the_whole_grid(tiny_identity, tmp_path):
    paths = write_shards(tiny_identity, tmp_path, 2)
    written = merge_profile_logs(paths, tmp_path / "out")
    profiles = {p.name: Profile.load(p) for p in written}
    retrieval = profiles["tiny-llama.retrieval.json"]
    specs = grid(needle_settings(tiny_identity))
    assert retrieval.trials["total"] == retrieval.trials["passed"] == len(specs) == 6
    assert "missing" not in retrieval.trials and retrieval.probe["shard"] is None
    for layer in range(LAYERS):
        expected = math.fsum(record(s)["scores"]["retrieval"][layer][0] for s in specs) / len(specs)
        assert retrieval.query_heads[layer][0] == pytest.approx(expected, rel=1e-12)
    assert sorted(map(tuple, retrieval.probe["merged_shards"])) == [(0, 2), (1, 2)]


def test_shard_logs_of_several_passes_merge_pass_by_pass(tiny_identity, tmp_path):
    # profile --merge out/*.shard*of2.trials.jsonl: the retrieval and the reasoning shards of one run
    paths = write_shards(tiny_identity, tmp_path, 2)
    reasoning_paths = []
    for i in range(2):
        settings = {**needle_settings(tiny_identity, (i, 2)), "pass": "reasoning", "probes": ["retrieval_reasoning"],
                    "needle_set": {"path": "needles/reasoning.jsonl", "shipped": True, "fingerprint": "g" * 16,
                                   "ids": ["q01", "q02"]}}
        path = tmp_path / f"tiny.reasoning.shard{i}of2.trials.jsonl"
        with TrialLog(path, settings) as log:
            for spec in shard_trials(make_grid(["q01", "q02"], [300], [0.0, 0.5, 1.0], [0]), (i, 2)):
                r = record(spec)
                r["scores"] = {"retrieval_reasoning": r["scores"]["retrieval"]}
                log.append(r)
        reasoning_paths.append(path)
    written = merge_profile_logs([paths[0], reasoning_paths[1], paths[1], reasoning_paths[0]], tmp_path / "out")
    profiles = {p.name: Profile.load(p) for p in written}
    assert sorted(profiles) == ["tiny-llama.enhanced_retrieval.json", "tiny-llama.retrieval.json",
                                "tiny-llama.retrieval_reasoning.json"]
    assert all(p.trials["total"] == 6 and "missing" not in p.trials for p in profiles.values())
    reasoning_specs = make_grid(["q01", "q02"], [300], [0.0, 0.5, 1.0], [0])
    for layer in range(LAYERS):
        expected = math.fsum(record(s)["scores"]["retrieval"][layer][0] for s in reasoning_specs) / 6
        assert profiles["tiny-llama.retrieval_reasoning.json"].query_heads[layer][0] == pytest.approx(expected, rel=1e-12)
    assert sorted(map(tuple, profiles["tiny-llama.retrieval_reasoning.json"].probe["merged_shards"])) == [(0, 2), (1, 2)]
    # a pass with a shard missing stops the whole merge before anything is written
    with pytest.raises(HeadprobeError, match="shard 0/2 not given"):
        merge_profile_logs(paths + reasoning_paths[1:], tmp_path / "again")
    assert not (tmp_path / "again").exists() or not list((tmp_path / "again").iterdir())


def test_an_incomplete_shard_set_is_refused_unless_allowed(tiny_identity, tmp_path):
    paths = write_shards(tiny_identity, tmp_path, 2, which=[0])
    with pytest.raises(HeadprobeError) as err:
        merge_profile_logs(paths, tmp_path / "out")
    message = str(err.value)
    # shard 1 of 2 holds the depth-0.5 group: both of its trials are named as missing
    assert "2 of 6 trials of the grid are missing" in message and "shard 1/2 not given" in message
    assert "r01|len=300|depth=0.5000|seed=0" in message and "allow_partial=True" in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    written = merge_profile_logs(paths, tmp_path / "out", allow_partial=True)
    partial = Profile.load(written[0])
    assert partial.trials["total"] == 4 and partial.trials["missing"] == 2


def test_an_unfinished_shard_names_its_missing_trials(tiny_identity, tmp_path):
    paths = write_shards(tiny_identity, tmp_path, 2)
    lines = paths[1].read_text().splitlines()
    paths[1].write_text("\n".join(lines[:-1]) + "\n")             # shard 1 stopped one trial short
    with pytest.raises(HeadprobeError, match=r"1 of 6 trials of the grid are missing \(first: r02\|len=300\|depth=0.5000"):
        merge_logs(paths)


@pytest.mark.parametrize("field, value, message", [
    ("nan", float("nan"), "field 'scores.retrieval[1][2]': expected a finite number >= 0, found nan"),
    ("negative", -0.5, "field 'scores.retrieval[1][2]': expected a finite number >= 0, found -0.5"),
    ("rows", None, "field 'scores.retrieval': expected 4 rows (one per layer), found 3 rows"),
    ("gates", None, "field 'gates.published': expected true or false, found None"),
    ("heads", None, "field 'scores.enhanced_retrieval[0]': expected 4 values, found 3 values"),
])
def test_bad_records_are_named_by_file_line_and_field(tiny_identity, tmp_path, field, value, message):
    paths = write_shards(tiny_identity, tmp_path, 2)
    lines = paths[0].read_text().splitlines()
    bad = json.loads(lines[2])                                       # the second trial: line 3
    if field in ("nan", "negative"):
        bad["scores"]["retrieval"][1][2] = value
    elif field == "rows":
        bad["scores"]["retrieval"] = bad["scores"]["retrieval"][:3]
    elif field == "gates":
        bad["gates"] = {}
    else:
        bad["scores"]["enhanced_retrieval"][0] = bad["scores"]["enhanced_retrieval"][0][:3]
    lines[2] = json.dumps(bad)                                       # NaN is written as the JSON extension NaN
    paths[0].write_text("\n".join(lines) + "\n")
    with pytest.raises(HeadprobeError) as err:
        merge_profile_logs(paths, tmp_path / "out")
    assert str(err.value) == f"{paths[0]}:3: {message}"
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_merge_never_replaces_a_profile_without_force(tiny_identity, tmp_path):
    paths = write_shards(tiny_identity, tmp_path, 2)
    out = tmp_path / "out"
    out.mkdir()
    curated = out / "tiny-llama.retrieval.json"
    curated.write_text("curated")
    with pytest.raises(HeadprobeError, match="tiny-llama.retrieval.json exists; pass force=True to overwrite it"):
        merge_profile_logs(paths, out)
    assert curated.read_text() == "curated" and not (out / "tiny-llama.enhanced_retrieval.json").exists()
    merge_profile_logs(paths, out, force=True)
    assert Profile.load(curated).trials["total"] == 6


def test_merge_command_spells_the_refusals_as_flags(tiny_identity, tmp_path, capsys):
    from headprobe_cli.main import main

    paths = write_shards(tiny_identity, tmp_path, 2, which=[1])
    argv = ["profile", "--merge", *map(str, paths), "--out-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shards 0/2 not given" not in err[0] and "shard 0/2 not given" in err[0]
    assert "--resume" in err[0] and "--allow-partial" in err[0]
    assert main(argv + ["--allow-partial"]) == 0
    assert main(argv + ["--allow-partial"]) == 2
    assert "exists; pass --force to overwrite it or choose another --out-dir" in capsys.readouterr().err


# ---- file modes ----------------------------------------------------------------------------------

@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_every_output_respects_the_umask(umask, tmp_path, tiny_llama):
    os.environ.setdefault("MPLBACKEND", "Agg")
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
    written = [headprobe.frontend.atomic_write_json(tmp_path / "a.json", {"x": 1})]
    profile = Profile.load(headprobe.paths.shipped_profiles_dir() / "smollm2-135m.retrieval.json")
    written.append(profile.save(tmp_path / "p.json"))
    written.append(headprobe.write_headkv_json(profile, tmp_path / "scores.json"))
    duo = headprobe.write_duoattention(profile, tmp_path / "duo")
    written += [duo / "full_attention_heads.tsv", duo / "config.json"]
    bm = headprobe.allocate("headkv", [profile], capacity=64)
    written.append(bm.save(tmp_path / "b.json"))
    written.append(headprobe.write_layer_list(bm, tmp_path / "layers.json"))
    written.append(headprobe.save_figure(headprobe.head_heatmap(profile), tmp_path / "h.png"))
    written.append(headprobe.save_figure(headprobe.head_heatmap(profile), tmp_path / "h.svg"))
    with TrialLog(tmp_path / "t.trials.jsonl", {"a": 1}) as log:
        log.append({"trial": "t1"})
    written.append(tmp_path / "t.trials.jsonl")
    with TrialLog(tmp_path / "t.trials.jsonl", {"a": 1}, force=True) as log:   # replaced by a new file
        log.append({"trial": "t2"})
    with TrialLog(tmp_path / "t.trials.jsonl", {"a": 1}, resume=True) as log:  # continued
        log.append({"trial": "t3"})
    from headprobe.eval.items import items_from_needles
    from headprobe.eval.runner import EvalRequest, run_eval
    from headprobe.eval.settings import expand_settings

    needles = headprobe.load_needles(headprobe.shipped_needle_file("retrieval"), ["r01"])
    request = EvalRequest(expand_settings(["full"], [16]), items_from_needles(needles), [300], [0.5],
                          headprobe.load_haystack(), max_new_tokens=2, chat_template=False)
    run_eval(tiny_llama, request, tmp_path / "eval" / "e.json")
    written += [tmp_path / "eval" / "e.json", tmp_path / "eval" / "e.cells.jsonl"]
    assert {p.name: oct(_mode(p)) for p in map(Path, written)} == {Path(p).name: oct(file_mode) for p in written}
    assert _mode(duo) == dir_mode and _mode(tmp_path / "eval") == dir_mode
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".lock"))] == []


# ---- one writer per log --------------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_open_log_is_locked_and_a_dead_holders_lock_is_taken_over(tmp_path):
    path = tmp_path / "t.trials.jsonl"
    first = TrialLog(path, {"a": 1})
    first.append({"trial": "t1"})
    with pytest.raises(HeadprobeError, match=r"t.trials.jsonl: in use by this process \(lock .*t.trials.jsonl.lock\)"):
        TrialLog(path, {"a": 1}, resume=True)
    first.close()
    assert not (tmp_path / "t.trials.jsonl.lock").exists()
    # a process that died holding the lock left the file behind: the next run takes it over and says so
    dead = _dead_pid()
    (tmp_path / "t.trials.jsonl.lock").write_text(f"{dead}\n")
    with pytest.warns(RuntimeWarning, match=f"taking over the lock .* left by process {dead}"):
        again = TrialLog(path, {"a": 1}, resume=True)
    again.append({"trial": "t2"})
    again.close()
    assert [t["trial"] for t in read_log(path)[1]] == ["t1", "t2"]


def test_duplicate_records_are_dropped_on_resume_and_reported(tmp_path):
    path = tmp_path / "t.trials.jsonl"
    with TrialLog(path, {"a": 1}) as log:
        log.append({"trial": "t1", "x": 1})
        log.append({"trial": "t2", "x": 2})
    with open(path, "a") as handle:                          # what two unlocked writers used to leave
        handle.write(json.dumps({"trial": "t1", "x": 3}) + "\n")
    with pytest.warns(RuntimeWarning, match="1 duplicate trial record"):
        log = TrialLog(path, {"a": 1}, resume=True)
    log.close()
    assert {t: r["x"] for t, r in log.done.items()} == {"t1": 1, "t2": 2}
    assert [t["trial"] for t in read_log(path)[1]] == ["t1", "t2"]


def test_nothing_is_written_before_the_first_trial(tmp_path):
    path = tmp_path / "t.trials.jsonl"
    with pytest.raises(RuntimeError), TrialLog(path, {"a": 1}):
        raise RuntimeError("failed before any trial")
    assert list(tmp_path.iterdir()) == []                     # no header-only log blocks the rerun
    with TrialLog(path, {"a": 1}) as log:
        log.append({"trial": "t1"})
    before = path.read_bytes()
    with pytest.raises(RuntimeError), TrialLog(path, {"a": 2}, force=True):
        raise RuntimeError("failed before any trial")
    assert path.read_bytes() == before                        # force keeps the old log until a new trial
    with TrialLog(path, {"a": 2}, force=True) as log:
        log.append({"trial": "n1"})
    assert read_log(path) == ({"a": 2}, [{"trial": "n1"}])


# ---- portable names ------------------------------------------------------------------------------

def test_logs_name_needle_files_portably(tiny_llama, tmp_path, monkeypatch):
    from headprobe.probes.run import ProfileRequest, run_profile

    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    shipped = headprobe.shipped_needle_file("retrieval")
    (mine / "needles.jsonl").write_text(shipped.read_text().splitlines()[0] + "\n")
    (mine / "hay.txt").write_text(headprobe.load_haystack().text)
    runs = {"shipped": {}, "user": {"needle_files": {"retrieval": mine / "needles.jsonl"},
                                    "haystack": str(mine / "hay.txt")}}
    headers = {}
    for name, extra in runs.items():
        request = ProfileRequest(probes=["retrieval"], lengths=[300], depths=[0.5], out_dir=tmp_path / name,
                                 needle_ids=["r01"], chat_template=False, **extra)
        result = run_profile(tiny_llama, request)
        headers[name] = read_log(result.logs[0])[0]
    assert headers["shipped"]["needle_set"]["path"] == "needles/retrieval.jsonl"
    assert headers["shipped"]["needle_set"]["shipped"] is True
    assert headers["user"]["needle_set"]["path"] == "mine/needles.jsonl"
    assert headers["user"]["needle_set"]["shipped"] is False
    assert headers["user"]["haystack"]["name"] == "mine/hay.txt"
    for header in headers.values():
        text = json.dumps(header)
        assert str(tmp_path) not in text and str(ROOT) not in text
        assert len(header["needle_set"]["fingerprint"]) == 16


def test_old_absolute_needle_paths_still_read_and_resume(tmp_path):
    # shipped profiles made before portable names hold the maker's absolute path; they still load
    old = Profile.load(headprobe.paths.shipped_profiles_dir() / "smollm2-135m.retrieval.json")
    assert Path(old.probe["needle_set"]["path"]).is_absolute()
    path = tmp_path / "t.trials.jsonl"
    fingerprint = old.probe["needle_set"]["fingerprint"]
    with TrialLog(path, {"needle_set": {"path": "/elsewhere/retrieval.jsonl", "fingerprint": fingerprint}}) as log:
        log.append({"trial": "t1"})
    new = {"needle_set": {"path": "needles/retrieval.jsonl", "shipped": True, "fingerprint": fingerprint}}
    TrialLog(path, new, resume=True).close()                  # the same file, named another way
    other = {"needle_set": {"path": "needles/retrieval.jsonl", "shipped": True, "fingerprint": "0" * 16}}
    with pytest.raises(HeadprobeError, match=r"other settings \(needle_set\)"):
        TrialLog(path, other, resume=True)


# ---- progress bars -------------------------------------------------------------------------------

def test_loading_draws_no_transformers_bar(tmp_path, capfd):
    import conftest
    from transformers.utils import logging as hf_logging

    conftest.save_tiny_llama(tmp_path / "tiny")
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        headprobe.load_model(str(tmp_path / "tiny"), device="cpu")
    assert "Loading weights" not in capfd.readouterr().err
    list(hf_logging.tqdm(range(3), desc="after loading"))        # transformers' bars draw again afterwards
    assert "after loading" in capfd.readouterr().err
