"""Output folders that cannot be written, and the trial log's resume rules."""

from __future__ import annotations

import pytest

from headprobe import HeadprobeError
from headprobe.files.trial_log import TrialLog, read_log


def test_unwritable_output_dir(tmp_path):
    from headprobe.files.jsonio import check_writable_dir

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(HeadprobeError, match="not writable"):
        check_writable_dir(blocker / "sub")


def test_trial_log_resume_rules(tmp_path):
    path = tmp_path / "t.jsonl"
    log = TrialLog(path, {"a": 1})
    log.append({"trial": "t1", "x": 1})
    with pytest.raises(HeadprobeError, match="pass resume=True to continue it or force=True to start over"):
        TrialLog(path, {"a": 1})
    with pytest.raises(HeadprobeError, match=r"other settings \(a\)"):
        TrialLog(path, {"a": 2}, resume=True)
    log.close()                               # an open log is locked against every other writer
    with open(path, "a") as handle:
        handle.write('{"trial": "t2", "x"')  # torn write
    again = TrialLog(path, {"a": 1, "batch_size": 8}, resume=True)
    assert "t1" in again and "t2" not in again
    again.append({"trial": "t2", "x": 2})
    _, trials = read_log(path)
    assert [t["trial"] for t in trials] == ["t1", "t2"]
