"""Writes that fail or race: a result another run wrote meanwhile is refused, not replaced; a full disk or a
read-only folder ends in one line with nothing half-written left; a log line is appended whole or not at
all; the lock of a log that is a folder, or that names a live process, is described as it is; a run that
fails leaves no empty folder behind."""

from __future__ import annotations

import builtins
import errno
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from headprobe import HeadprobeError
from headprobe.files import atomic, log_lock, trial_log
from headprobe.files.atomic import atomic_write_text, put_in_place, write_folder_atomically
from headprobe.files.jsonio import atomic_write_json, check_writable_dir
from headprobe.files.log_lock import LogLock, lock_path
from headprobe.files.trial_log import TrialLog, read_log

ROOT = Path(__file__).resolve().parents[2]


def disk_full_after(monkeypatch, module, budget: int) -> None:
    """``os.write`` in ``module`` behaves as on a disk with ``budget`` bytes left: it writes what fits, then
    fails with ENOSPC (as the kernel does: a short write, then the error)."""
    left = {"bytes": budget}
    real = os.write

    def write(fd, data):
        if left["bytes"] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data)[:left["bytes"]])
        left["bytes"] -= n
        return n

    monkeypatch.setattr(module.os, "write", write)


def read_only(monkeypatch, folder: Path) -> None:
    """Calls that create or remove entries in ``folder`` fail with EROFS, as on a read-only mount (where even
    removing a name that does not exist fails with EROFS, not ENOENT)."""
    folder = str(folder.resolve())

    def inside(path) -> bool:
        return str(Path(os.fsdecode(path)).resolve()).startswith(folder + os.sep)

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real_open, real_os_open, real_unlink = builtins.open, os.open, os.unlink
    real_mkdir, real_path_unlink = os.mkdir, Path.unlink

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and inside(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def unlink(path, *args, **kwargs):
        if inside(path):
            refuse(path)
        return real_unlink(path, *args, **kwargs)

    def path_unlink(self, missing_ok=False):
        if inside(self):
            refuse(self)
        return real_path_unlink(self, missing_ok=missing_ok)

    def mkdir(path, *args, **kwargs):
        if inside(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(Path, "unlink", path_unlink)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---- a result is refused, not replaced, when the name was taken after the check -------------------

def test_a_file_written_meanwhile_is_refused_and_kept(tmp_path):
    target = tmp_path / "p.json"
    atomic_write_json(target, {"mine": 1}, overwrite=False)
    with pytest.raises(HeadprobeError, match=r"p.json exists; pass force=True to overwrite it \(it was written while "
                                             r"this run worked; nothing was replaced\)"):
        atomic_write_json(target, {"theirs": 2}, overwrite=False)
    assert json.loads(target.read_text()) == {"mine": 1}
    assert leftovers(tmp_path) == []
    atomic_write_json(target, {"theirs": 2}, overwrite=True)
    assert json.loads(target.read_text()) == {"theirs": 2}


def test_without_hard_links_the_name_is_reserved_before_the_rename(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "link", no_links)
    target = tmp_path / "p.json"
    atomic_write_text(target, "first", overwrite=False)
    assert target.read_text() == "first"
    with pytest.raises(HeadprobeError, match="exists; pass force=True"):
        atomic_write_text(target, "second", overwrite=False)
    assert target.read_text() == "first" and leftovers(tmp_path) == []


def test_put_in_place_refuses_a_folder_of_that_name(tmp_path):
    (tmp_path / "p.json").mkdir()
    tmp = tmp_path / ".p.json.x.tmp"
    tmp.write_text("x")
    with pytest.raises(HeadprobeError, match="exists"):
        put_in_place(tmp, tmp_path / "p.json", overwrite=False)
    assert not tmp.exists()


# ---- full disk, read-only folder ----------------------------------------------------------------

def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "p.json"
    target.write_text("old")

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(HeadprobeError, match=r"p.json: cannot write \(No space left on device\)$"):
        atomic_write_text(target, "new" * 1000)
    assert target.read_text() == "old" and leftovers(tmp_path) == []


def test_a_read_only_folder_is_one_line_without_a_second_error(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(monkeypatch, ro)
    with pytest.raises(HeadprobeError, match=r"ro/p.json: cannot write \(Read-only file system\)$") as err:
        atomic_write_text(ro / "p.json", "x")
    assert "\n" not in str(err.value)
    with pytest.raises(HeadprobeError, match="not writable"):
        check_writable_dir(ro)


def test_a_figure_into_a_read_only_folder_is_one_line(tmp_path, monkeypatch, capsys):
    from headprobe_cli.main import main

    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(monkeypatch, ro)
    profile = ROOT / "profiles" / "smollm2-135m.retrieval.json"
    assert main(["plot", str(profile), "-o", str(ro / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"headprobe: error: {ro / 'p.png'}: cannot write (Read-only file system)"]


def test_an_export_folder_that_fails_half_way_leaves_nothing_that_blocks_the_rerun(tmp_path, monkeypatch):
    files = {"full_attention_heads.tsv": "0.1\t0.9\n", "config.json": "{}\n"}
    calls = {"n": 0}
    real = atomic.os.fsync

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] == 2:                       # the second file finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(HeadprobeError, match=r"duo: cannot write \(No space left on device\)"):
        write_folder_atomically(tmp_path / "duo", files)
    assert sorted(p.name for p in tmp_path.iterdir()) == []          # no half folder, no temporary
    monkeypatch.setattr(atomic.os, "fsync", real)
    write_folder_atomically(tmp_path / "duo", files)                   # the rerun, without force
    assert {p.name: p.read_text() for p in (tmp_path / "duo").iterdir()} == files
    with pytest.raises(HeadprobeError, match="duo exists; pass force=True"):
        write_folder_atomically(tmp_path / "duo", files)


def test_an_export_folder_written_meanwhile_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "duo"
    real_rename = atomic.os.rename

    def rename(src, dst):                          # another export finishes just before this one
        theirs.mkdir()
        (theirs / "full_attention_heads.tsv").write_text("theirs\n")
        return real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)
    with pytest.raises(HeadprobeError, match="duo exists; pass force=True"):
        write_folder_atomically(theirs, {"full_attention_heads.tsv": "mine\n"})
    assert (theirs / "full_attention_heads.tsv").read_text() == "theirs\n" and leftovers(tmp_path) == []


# ---- the trial log on a full disk ----------------------------------------------------------------

def test_a_log_line_is_appended_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "t.trials.jsonl"
    log = TrialLog(path, {"a": 1})
    log.append({"trial": "t1", "x": 1})
    before = path.read_bytes()
    disk_full_after(monkeypatch, trial_log, 10)           # room for 10 bytes of the next line
    with pytest.raises(HeadprobeError, match=r"t.trials.jsonl: cannot write \(No space left on device\)$"):
        log.append({"trial": "t2", "x": "y" * 100})
    assert path.read_bytes() == before                    # no torn line
    log.close(finished=False)
    monkeypatch.undo()
    with TrialLog(path, {"a": 1}, resume=True) as again:
        assert list(again.done) == ["t1"]
        again.append({"trial": "t2", "x": 2})
    assert [t["trial"] for t in read_log(path)[1]] == ["t1", "t2"]


def test_the_first_trial_on_a_full_disk_leaves_no_log(tmp_path, monkeypatch):
    path = tmp_path / "t.trials.jsonl"
    log = TrialLog(path, {"a": 1})

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(HeadprobeError, match=r"t.trials.jsonl: cannot write \(No space left on device\)$"):
        log.append({"trial": "t1"})
    log.close(finished=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_profile_run_that_hits_the_file_size_limit_ends_in_one_line_and_resumes(tiny_dir, tmp_path):
    """A real short write: the kernel writes what the limit allows, then refuses (EFBIG)."""
    out = tmp_path / "out"
    argv = ["profile", "--model", str(tiny_dir), "--device", "cpu", "--probe", "retrieval", "--lengths", "300",
            "--depths", "0", "50", "100", "--needles", "r01", "--no-chat-template", "--batch-size", "1",
            "--out-dir", str(out)]
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1]))); "
            "from headprobe_cli.main import main; sys.exit(main(sys.argv[2:]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli"),
                                                         os.environ.get("PYTHONPATH", "")])}
    full = subprocess.run([sys.executable, "-c", code, str(1 << 30), *argv], env=env, capture_output=True, text=True, check=False)
    assert full.returncode == 2                              # the random model passes no gate: a log only
    log = out / "tiny.retrieval.trials.jsonl"
    sizes = [len(line) + 1 for line in log.read_text().splitlines()]
    whole = log.read_text()
    log.unlink()
    limit = sum(sizes[:3]) + sizes[3] // 2                   # header, two trials and half of the third fit
    run = subprocess.run([sys.executable, "-c", code, str(limit), *argv], env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 2
    errors = re.findall(r"headprobe: error: .*", run.stderr)       # the progress bar may share its line
    assert errors == [f"headprobe: error: {log}: cannot write (File too large)"], run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    text = log.read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 3           # no torn line

    def records(text):                                                   # the trials, without their timings
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in text.splitlines()]

    assert records(text) == records(whole)[:3]
    again = subprocess.run([sys.executable, "-c", code, str(1 << 30), *argv, "--resume"], env=env,
                           capture_output=True, text=True, check=False)
    assert again.returncode == 2 and records(log.read_text()) == records(whole)      # resumed: the same log


# ---- locks ---------------------------------------------------------------------------------------

def test_a_lock_that_is_a_folder_is_one_line(tmp_path):
    log = tmp_path / "t.trials.jsonl"
    lock_path(log).mkdir()
    with pytest.raises(HeadprobeError, match=r"t.trials.jsonl: cannot lock the log: .*t.trials.jsonl.lock is a "
                                             r"folder, not a lock file; remove it if no run writes to the log$"):
        TrialLog(log, {"a": 1})


def test_a_lock_naming_a_live_process_that_does_not_hold_it_is_described_as_such(tmp_path):
    log = tmp_path / "t.trials.jsonl"
    lock_path(log).write_text("1\n")                      # process 1 runs, but holds no flock on this file
    with pytest.warns(RuntimeWarning) as caught:
        LogLock(log).release()
    message = str(caught[0].message)
    assert "left by process 1, which is running but does not hold it" in message
    assert "ended" not in message
    dead = 2 ** 22 + 12345                                 # above Linux's pid_max: no such process
    lock_path(log).write_text(f"{dead}\n")
    with pytest.warns(RuntimeWarning, match=f"left by process {dead}, which no longer holds it"):
        LogLock(log).release()


def test_a_lock_taken_only_to_check_leaves_no_folder(tmp_path):
    log = tmp_path / "a" / "b" / "t.trials.jsonl"
    LogLock(log).release()
    assert not (tmp_path / "a").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lock = LogLock(log)
        log.write_text("kept\n")
        lock.release()
    assert log.read_text() == "kept\n"                     # a folder with a file in it stays


def test_checking_an_output_folder_does_not_create_it(tmp_path):
    check_writable_dir(tmp_path / "x" / "y")
    assert not (tmp_path / "x").exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(HeadprobeError, match=r"output directory is not writable \(.*f is a file, not a folder\)"):
        check_writable_dir(tmp_path / "f" / "y")


def test_a_process_id_is_alive_only_while_its_process_runs():
    assert log_lock._alive(os.getpid()) and not log_lock._alive(0) and not log_lock._alive(-3)


def test_a_lock_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    def pwrite(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(log_lock.os, "pwrite", pwrite)
    log = tmp_path / "new" / "e.cells.jsonl"
    with pytest.raises(HeadprobeError, match=r"e.cells.jsonl: cannot write its lock file .*e.cells.jsonl.lock \(No "
                                             r"space left on device\)$"):
        LogLock(log)
    assert not (tmp_path / "new").exists()


def test_a_failed_write_removes_the_folders_it_made(tmp_path, monkeypatch):
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(HeadprobeError, match="No space left on device"):
        atomic_write_text(tmp_path / "a" / "b" / "p.json", "x")
    with pytest.raises(HeadprobeError, match="No space left on device"):
        write_folder_atomically(tmp_path / "c" / "duo", {"f.tsv": "x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_export_into_an_empty_folder_that_fails_leaves_it_empty(tmp_path, monkeypatch):
    folder = tmp_path / "duo"
    folder.mkdir()
    calls = {"n": 0}
    real = atomic.os.fsync

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(HeadprobeError, match=r"No space left on device"):
        write_folder_atomically(folder, {"a.tsv": "1\n", "config.json": "{}\n"})
    assert folder.is_dir() and list(folder.iterdir()) == []
    monkeypatch.setattr(atomic.os, "fsync", real)
    write_folder_atomically(folder, {"a.tsv": "1\n", "config.json": "{}\n"})
    assert sorted(p.name for p in folder.iterdir()) == ["a.tsv", "config.json"]
