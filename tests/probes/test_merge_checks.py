"""What ``profile --merge`` refuses before averaging: scores no probe can produce, record fields of the
wrong type, shard sets that are not one split of the grid, logs of different versions, and file names
that leave the output folder. Each refusal is one line naming the file (and line and field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headprobe import HeadprobeError
from headprobe.files.trial_log import TrialLog
from headprobe.probes.run import merge_profile_logs
from headprobe.probes.trial_grid import make_grid, shard_trials
from headprobe.profile import Profile

LAYERS, HEADS = 4, 4            # conftest.make_tiny_llama


@pytest.fixture(scope="module")
def identity():
    import conftest

    return conftest.make_tiny_llama().identity


def settings_of(identity, shard=None, version="1.0") -> dict:
    """The settings a retrieval pass of the tiny model records."""
    return {"model": identity.to_json(), "mode": "fast", "chat_template": False, "headprobe_version": version,
            "group_reduction": "mean", "pass": "retrieval", "probes": ["retrieval", "enhanced_retrieval"],
            "lengths": [300], "depths": [0.0, 0.5, 1.0], "seeds": [0],
            "needle_set": {"path": "needles/retrieval.jsonl", "shipped": True, "fingerprint": "f" * 16,
                           "ids": ["r01", "r02"]},
            "haystack": {"name": "headprobe-corpus", "fingerprint": "h" * 16}, "gate": "published",
            "max_new_tokens": 24, "shard": list(shard) if shard else None}


def record(spec, score: float = 0.5) -> dict:
    """A passing trial record with every field a fast-mode record holds."""
    return {"trial": spec.id, "needle": spec.needle_id, "length": spec.length, "depth": spec.depth,
            "seed": spec.seed, "mode": "fast", "prompt_tokens": 299, "answer_span": [120, 124],
            "actual_depth": spec.depth, "response": "blue tulip seven",
            "gates": {"rouge1_recall": 1.0, "qa_f1": 1.0, "greedy_is_gold": True, "published": True},
            "passed": True,
            "scores": {"retrieval": [[score] * HEADS for _ in range(LAYERS)],
                       "enhanced_retrieval": [[score / 2] * HEADS for _ in range(LAYERS)]},
            "seconds": 0.25}


def write_log(identity, path: Path, shard=None, version="1.0", edit=None) -> Path:
    """The log of shard ``shard`` (or the whole grid), each record passed through ``edit``."""
    settings = settings_of(identity, shard, version)
    specs = make_grid(["r01", "r02"], [300], [0.0, 0.5, 1.0], [0])
    with TrialLog(path, settings) as log:
        for spec in shard_trials(specs, tuple(shard) if shard else None):
            r = record(spec)
            log.append(edit(r) if edit else r)
    return path


def shards(identity, folder: Path, n: int = 2, **kw) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [write_log(identity, folder / f"tiny.retrieval.shard{i}of{n}.trials.jsonl", (i, n), **kw) for i in range(n)]


def refused(paths, out: Path, **kw) -> str:
    """The one-line refusal of merging ``paths``; nothing is written to ``out``."""
    with pytest.raises(HeadprobeError) as err:
        merge_profile_logs(paths, out, **kw)
    message = str(err.value)
    assert "\n" not in message
    assert not out.exists() or not list(out.iterdir())
    return message


def edit_line(path: Path, line: int, change) -> None:
    """Rewrite record ``line`` (1-based, the header is line 1) of a log by ``change(record)``."""
    lines = path.read_text().splitlines()
    r = json.loads(lines[line - 1])
    change(r)
    lines[line - 1] = json.dumps(r)
    path.write_text("\n".join(lines) + "\n")


# ---- scores no probe can produce ------------------------------------------------------------------

def test_a_score_beyond_what_the_probe_can_produce_is_refused(identity, tmp_path):
    # every record passed the finite check; averaging 1e308s overflowed math.fsum
    paths = shards(identity, tmp_path, edit=lambda r: {**r, "scores": {
        k: [[1e308] * HEADS for _ in range(LAYERS)] for k in r["scores"]}})
    message = refused(paths, tmp_path / "out")
    # tiny-llama: a trial of 300 tokens with max_new_tokens 24, context 4096: at most 4096 response steps
    assert message == (f"{paths[0]}:2: field 'scores.retrieval[0][0]': expected a number from 0 to 4096, "
                       "found 1e+308")


def test_the_largest_score_a_trial_can_hold_still_merges(identity, tmp_path):
    # a score at the bound is a possible measurement: it merges, and the mean is exact
    paths = shards(identity, tmp_path, edit=lambda r: {**r, "scores": {
        k: [[4096.0] * HEADS for _ in range(LAYERS)] for k in r["scores"]}})
    written = merge_profile_logs(paths, tmp_path / "out")
    assert Profile.load(written[0]).query_heads[0][0] == 4096.0


def test_seconds_of_any_size_average_without_overflow(identity, tmp_path):
    # nothing bounds a trial's time, so a huge one is averaged (not refused, not an OverflowError)
    paths = shards(identity, tmp_path, edit=lambda r: {**r, "seconds": 1e308})
    written = merge_profile_logs(paths, tmp_path / "out")
    assert Profile.load(written[0]).trials["mean_seconds"] == pytest.approx(1e308)


def test_a_layer_share_above_one_is_refused(identity, tmp_path):
    settings = {"model": identity.to_json(), "mode": "fast", "chat_template": False, "headprobe_version": "1.0",
                "group_reduction": "mean", "pass": "layer_retention", "probes": ["layer_retention"],
                "tasks": ["code"], "samples": 2, "window": 8, "kernel_size": 7, "capacity": 128, "max_tokens": 2048,
                "shard": None}
    path = tmp_path / "tiny.layer_retention.trials.jsonl"
    with TrialLog(path, settings) as log:
        for i in range(2):
            log.append({"trial": f"code-{i}", "task": "code", "prompt_tokens": 100, "retention": [1e308] * LAYERS,
                        "seconds": 1.0})
    assert refused([path], tmp_path / "out") == (f"{path}:2: field 'retention[0]': expected a number from 0 to 1, "
                                                 "found 1e+308")


# ---- record fields of the wrong type --------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("passed", "yes", "field 'passed': expected true or false, found 'yes'"),
    ("seconds", "fast", "field 'seconds': expected a finite number >= 0, found 'fast'"),
    ("seconds", -1, "field 'seconds': expected a finite number >= 0, found -1"),
    ("mode", "quick", "field 'mode': expected one of fast, reference, reuse, found 'quick'"),
    ("prompt_tokens", 2.5, "field 'prompt_tokens': expected an integer >= 0, found 2.5"),
    ("answer_span", [5, 2], "field 'answer_span': expected [start, end] with 0 <= start < end, found [5, 2]"),
    ("response", None, "field 'response': expected a string, found None"),
    ("actual_depth", "half", "field 'actual_depth': expected a finite number, found 'half'"),
    ("depth", 1.5, "field 'depth': expected a number from 0 to 1, found 1.5"),
    ("gates.qa_f1", "high", "field 'gates.qa_f1': expected a number from 0 to 1, found 'high'"),
    ("gates.greedy_is_gold", 1, "field 'gates.greedy_is_gold': expected true or false, found 1"),
])
def test_every_record_field_is_checked(identity, tmp_path, field, value, message):
    paths = shards(identity, tmp_path)

    def change(r):
        if field.startswith("gates."):
            r["gates"][field.split(".")[1]] = value
        else:
            r[field] = value
    edit_line(paths[1], 3, change)
    assert refused(paths, tmp_path / "out") == f"{paths[1]}:3: {message}"


def test_the_command_names_a_bad_field_in_one_line(identity, tmp_path, capsys):
    from headprobe_cli.main import main

    paths = shards(identity, tmp_path)
    edit_line(paths[0], 2, lambda r: r.update(passed="yes"))
    assert main(["profile", "--merge", *map(str, paths), "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"headprobe: error: {paths[0]}:2: field 'passed': expected true or false, found 'yes'"]


# ---- shard sets -----------------------------------------------------------------------------------

def test_a_shard_given_twice_is_refused(identity, tmp_path):
    paths = shards(identity, tmp_path)
    assert refused([paths[0], paths[0], paths[1]], tmp_path / "out") == (
        f"{paths[0]}: shard 0/2 again ({paths[0]} is shard 0/2 too); give each shard's log once")
    copy = tmp_path / "copy.trials.jsonl"
    copy.write_text(paths[1].read_text())
    assert refused([*paths, copy], tmp_path / "out") == (
        f"{copy}: shard 1/2 again ({paths[1]} is shard 1/2 too); give each shard's log once")


@pytest.mark.parametrize("shard", [[5, 2], [2, 2], [-1, 2], [0, 0], [1], "0/2", [0.5, 2], [True, 2]])
def test_an_impossible_shard_is_refused(identity, tmp_path, shard):
    paths = shards(identity, tmp_path)
    edit_line(paths[1], 1, lambda header: header["settings"].update(shard=shard))
    assert refused(paths, tmp_path / "out") == (
        f"{paths[1]}: field 'settings.shard': expected null or [i, n] with 0 <= i < n, found {shard!r}")


def test_shards_of_different_splits_are_refused(identity, tmp_path):
    halves = shards(identity, tmp_path / "two", n=2)
    thirds = shards(identity, tmp_path / "three", n=3)
    assert refused([halves[0], thirds[1], thirds[2]], tmp_path / "out") == (
        f"{thirds[1]}: shard 1/3, but {halves[0]} is shard 0/2; merge the logs of one split of the grid (one n)")


def test_a_log_of_the_whole_grid_merges_alone(identity, tmp_path):
    whole = write_log(identity, tmp_path / "tiny.retrieval.trials.jsonl")
    paths = shards(identity, tmp_path)
    assert refused([whole, paths[1]], tmp_path / "out") == (
        f"{whole}: a log of the whole grid (no shard) merges alone, not beside the shard log {paths[1]}")
    assert "the whole grid (no shard) again" in refused([whole, whole], tmp_path / "out")
    assert Profile.load(merge_profile_logs([whole], tmp_path / "out")[0]).trials["total"] == 6


# ---- versions -------------------------------------------------------------------------------------

def test_shards_of_different_versions_are_refused(identity, tmp_path):
    paths = [write_log(identity, tmp_path / "a.trials.jsonl", (0, 2), version="1.0"),
             write_log(identity, tmp_path / "b.trials.jsonl", (1, 2), version="1.1")]
    assert refused(paths, tmp_path / "out") == (
        f"{paths[1]}: written by headprobe 1.1, {paths[0]} by headprobe 1.0; merge logs of one version "
        "(rerun the other version's shards with force=True)")
    same = write_log(identity, tmp_path / "c.trials.jsonl", (1, 2), version="1.0")
    profile = Profile.load(merge_profile_logs([paths[0], same], tmp_path / "out")[0])
    assert profile.probe["headprobe_version"] == "1.0" and profile.trials["total"] == 6


# ---- the file-name stem ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../escape", "sub/name", "a\\b", "", "nul\0name"])
def test_a_name_that_is_not_a_plain_stem_is_refused(identity, tmp_path, name):
    paths = shards(identity, tmp_path / "logs")
    out = tmp_path / "a" / "b" / "out"
    message = refused(paths, out, name=name)
    assert message.startswith(f"name={name!r}: expected a ")
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == []      # nothing written anywhere

