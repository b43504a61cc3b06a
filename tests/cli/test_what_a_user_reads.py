"""What a user reads: warnings as one line, a DuoAttention export read back by explain without --model,
``--memory-plot none``, and an output name held by a symbolic link to nothing."""

from __future__ import annotations

import warnings

import pytest
import torch
from headprobe_cli.main import main

from headprobe.files.log_lock import LogLock

torch.set_num_threads(1)

PROFILE = "profiles/smollm2-135m.retrieval_reasoning.json"


def _stale_lock(log) -> None:
    """A lock file left by a process that no longer runs (process ids never reach 2^22 here)."""
    (log.parent / (log.name + ".lock")).write_text("4194999\n")


def test_a_warning_of_a_command_is_one_line_in_headprobe_s_voice(tmp_path, capsys):
    out = tmp_path / "e.json"
    _stale_lock(tmp_path / "e.cells.jsonl")
    before = warnings.showwarning
    argv = ["eval", "--settings", "full", "--lengths", "300", "--depths", "0", "--needle-ids", "r01",
            "--model", str(tmp_path / "no-model"), "--out", str(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("headprobe: warning: ") and "left by process 4194999" in err[0], err
    assert not any("RuntimeWarning" in line or "check_rerun_outputs" in line for line in err), err
    assert err[1].startswith("headprobe: error: ") and len(err) == 2, err
    assert warnings.showwarning is before                        # the command leaves Python's warnings as they were


def test_a_library_user_still_gets_a_python_warning(tmp_path):
    log = tmp_path / "x.jsonl"
    _stale_lock(log)
    with pytest.warns(RuntimeWarning, match="left by process 4194999"):
        LogLock(log).release()


def test_explain_reads_the_model_of_headprobe_s_own_duoattention_export(tmp_path, capsys):
    folder = tmp_path / "duo"
    assert main(["export", PROFILE, "--to", "duoattention", "-o", str(folder)]) == 0
    capsys.readouterr()
    assert main(["explain", str(folder), "--context", "2000"]) == 0, capsys.readouterr().err
    assert "SmolLM2-135M-Instruct" in capsys.readouterr().out


def test_memory_plot_none_writes_no_figure(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "--model", str(tiny_dir), "--settings", "full", "--lengths", "300", "--depths", "50",
            "--needle-ids", "r01", "--max-new-tokens", "1", "--no-chat-template", "--out", "e.json",
            "--plot", "none", "--memory-plot", "none"]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.cells.jsonl", "e.json"]


@pytest.mark.parametrize("argv", [
    ["allocate", "--capacity", "64", "-o"],
    ["explain", PROFILE, "--context", "2000", "--to", "budget", "-o"],
])
def test_an_output_that_is_a_link_to_nothing_is_refused_up_front(argv, tmp_path, capsys):
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "gone" / "target.json")
    assert main([*argv, str(link)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"headprobe: error: {link} is a symbolic link to {tmp_path / 'gone' / 'target.json'}, which "
                   "does not exist; remove the link or pass --force to replace it"), err
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def test_generate_says_why_when_the_compressed_cache_holds_more_than_the_full_one(tiny_dir, capsys):
    assert main(["generate", "--model", str(tiny_dir), "--capacity", "64", "--max-new-tokens", "4", "--no-chat",
                 "The river ran past the old mill."]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cache: "))
    share = float(line.split("new tokens: ")[1].split("%")[0])
    assert 100 < share < 125, line                             # all of the prompt kept, plus positions and spare rows
    assert "(above the full cache: the budget is no smaller than this prompt, so every head keeps all of it" in line
