"""User needle files: every file given is used, split by each needle's own kind; the trial log and the profile
record each file with its fingerprint; a file no requested probe reads is refused, not dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from headprobe_cli.main import main

from headprobe import HeadprobeError, ProfileRequest, run_profile
from headprobe.files.jsonio import file_fingerprint
from headprobe.haystack.needles import NEEDLE_KINDS, read_needle_files, shipped_needle_file
from headprobe.probes.plan import check_profile_run

torch.set_num_threads(1)

SHIPPED_RETRIEVAL = shipped_needle_file("retrieval")
SHIPPED_REASONING = shipped_needle_file("reasoning")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, needles: list[dict]) -> Path:
    path.write_text("".join(json.dumps(n) + "\n" for n in needles))
    return path


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    """Two retrieval files with distinct ids, a reasoning file, and a file holding both kinds."""
    retrieval, reasoning = _lines(SHIPPED_RETRIEVAL), _lines(SHIPPED_REASONING)
    renamed = [{**n, "id": "x" + n["id"]} for n in retrieval[2:4]]
    return {
        "a": _write(tmp_path / "a.jsonl", retrieval[:2]),
        "b": _write(tmp_path / "b.jsonl", renamed),
        "r": _write(tmp_path / "r.jsonl", reasoning[:2]),
        "mixed": _write(tmp_path / "mixed.jsonl", [reasoning[5], {**retrieval[6], "id": "m07"}]),
    }


def test_needles_are_split_by_their_own_kind(files):
    given = read_needle_files([files["r"], files["a"], files["mixed"]], NEEDLE_KINDS)
    paths, needles = given.of_kind("retrieval")
    assert paths == [files["a"], files["mixed"]]
    assert [n.id for n in needles] == ["r01", "r02", "m07"]
    paths, needles = given.of_kind("reasoning")
    assert paths == [files["r"], files["mixed"]] and [n.id for n in needles] == ["q01", "q02", "q06"]


def test_a_kind_no_file_holds_uses_the_shipped_needles(files):
    paths, needles = read_needle_files([files["a"]], NEEDLE_KINDS).of_kind("reasoning")
    assert paths == [SHIPPED_REASONING] and len(needles) == len(_lines(SHIPPED_REASONING))


def test_every_repeated_file_is_used(files):
    paths, needles = read_needle_files([files["a"], files["b"]], NEEDLE_KINDS).of_kind("retrieval")
    assert paths == [files["a"], files["b"]] and [n.id for n in needles] == ["r01", "r02", "xr03", "xr04"]


@pytest.mark.parametrize("given, kinds, message", [
    (["r"], {"retrieval"}, "holds only reasoning needles, which no requested probe reads"),
    (["a"], {"reasoning"}, "holds only retrieval needles"),
    (["a", "a"], {"retrieval"}, "given twice"),
])
def test_files_no_pass_would_read_are_refused(files, given, kinds, message):
    with pytest.raises(HeadprobeError, match=message) as info:
        read_needle_files([files[g] for g in given], kinds)
    assert str(files[given[0]]) in str(info.value) and "\n" not in str(info.value)


def test_an_id_two_files_share_is_refused(files, tmp_path):
    again = _write(tmp_path / "again.jsonl", _lines(SHIPPED_RETRIEVAL)[1:2])
    with pytest.raises(HeadprobeError, match="'r02' is also in .*a.jsonl"):
        read_needle_files([files["a"], again], {"retrieval"})


def test_request_checks_the_files_before_any_work(files, tmp_path):
    request = ProfileRequest(probes=["retrieval"], lengths=[300], depths=[0.5], out_dir=tmp_path / "out",
                             needle_files=[files["r"]])
    with pytest.raises(HeadprobeError, match=r"needle_files='.*r.jsonl': holds only reasoning needles, which no "
                                             r"requested probe reads \(the retrieval_reasoning probe does\)"):
        check_profile_run(request, "tiny")
    # a file is checked whichever probes are asked for
    with pytest.raises(HeadprobeError, match="holds only reasoning needles"):
        check_profile_run(ProfileRequest(probes=["layer_retention"], out_dir=tmp_path / "out",
                                         needle_files=[files["r"]]), "tiny")
    # the older {kind: path} form is read as its paths, so the kind still comes from the needles
    plan = check_profile_run(ProfileRequest(probes=["retrieval_reasoning"], lengths=[300], depths=[0.5],
                                            out_dir=tmp_path / "out", needle_files={"retrieval": files["r"]}), "tiny")
    assert [n.id for n in plan.passes[0].data.needles] == ["q01", "q02"]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_each_needle_file_is_read_once_for_all_passes(files, tmp_path, monkeypatch):
    from headprobe.haystack import needles

    reads = []
    real = needles.load_needles
    monkeypatch.setattr(needles, "load_needles", lambda path, *a, **kw: reads.append(path) or real(path, *a, **kw))
    plan = check_profile_run(ProfileRequest(probes=["retrieval", "enhanced_retrieval", "retrieval_reasoning"],
                                            lengths=[300], depths=[0.5], out_dir=tmp_path,
                                            needle_files=[files["a"], files["mixed"]]), "tiny")
    assert reads == [files["a"], files["mixed"]]      # no shipped file either: each kind is among them
    assert [[n.id for n in p.data.needles] for p in plan.passes] == [["r01", "r02", "m07"], ["q06"]]


def test_run_records_every_file_with_its_fingerprint(tiny_llama, files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # files are named relative to the run's folder, beside their fingerprint
    request = ProfileRequest(probes=["retrieval", "retrieval_reasoning"], lengths=[300], depths=[0.5],
                             out_dir=tmp_path / "out", needle_files=[files["a"], files["b"], files["r"]],
                             chat_template=False, gate="likelihood", name="tiny")
    result = run_profile(tiny_llama, request)
    retrieval = _lines(tmp_path / "out" / "tiny.retrieval.trials.jsonl")
    reasoning = _lines(tmp_path / "out" / "tiny.reasoning.trials.jsonl")
    assert retrieval[0]["settings"]["needle_set"] == {
        "files": [{"path": "a.jsonl", "shipped": False, "fingerprint": file_fingerprint(files["a"])},
                  {"path": "b.jsonl", "shipped": False, "fingerprint": file_fingerprint(files["b"])}],
        "ids": ["r01", "r02", "xr03", "xr04"]}
    assert sorted(r["needle"] for r in retrieval[1:]) == ["r01", "r02", "xr03", "xr04"]
    assert reasoning[0]["settings"]["needle_set"] == {
        "path": "r.jsonl", "shipped": False, "fingerprint": file_fingerprint(files["r"]), "ids": ["q01", "q02"]}
    assert sorted(r["needle"] for r in reasoning[1:]) == ["q01", "q02"]
    # a profile written from these logs carries the same record
    for path in result.profiles:
        probe = json.loads(path.read_text())["probe"]
        expected = retrieval if "retrieval_reasoning" not in path.name else reasoning
        assert probe["needle_set"] == expected[0]["settings"]["needle_set"]


def test_command_uses_every_needle_file(files, tmp_path, capsys, monkeypatch):
    import conftest

    monkeypatch.chdir(tmp_path)
    conftest.save_tiny_llama(tmp_path / "tiny")
    out = tmp_path / "out"
    main(["profile", "--model", str(tmp_path / "tiny"), "--device", "cpu", "--probe", "retrieval", "--lengths",
          "300", "--depths", "50", "--no-chat-template", "--out-dir", str(out), "--needle-file", str(files["a"]),
          "--needle-file", str(files["b"])])
    log = _lines(out / "tiny.retrieval.trials.jsonl")
    assert [f["path"] for f in log[0]["settings"]["needle_set"]["files"]] == ["a.jsonl", "b.jsonl"]
    assert sorted(r["needle"] for r in log[1:]) == ["r01", "r02", "xr03", "xr04"]
