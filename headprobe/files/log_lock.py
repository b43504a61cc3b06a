"""One writer per log: a lock file beside the log, held while a run appends to it.

Two runs appending to one log (two ``resume`` runs on one output folder, say) would both run the
trials the log lacks and log them twice. The lock is ``<log>.lock``: an advisory ``fcntl.flock`` held
for as long as the log is open, with the holder's process id written inside so that a refusal can name
it. The operating system drops the flock when its process ends, however it ends; a lock file that no
process holds is taken over, with a warning that names the process it names and says whether that
process still runs (a reused process id, or a lock file copied from elsewhere) or ended. Folders
made for the lock are removed with it when nothing else was written in them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import warnings
from pathlib import Path

from ..errors import HeadprobeError
from .atomic import missing_folders, remove_empty_folders


def lock_path(log: str | Path) -> Path:
    """``<log>.lock``: the lock file of a log."""
    log = Path(log)
    return log.with_name(log.name + ".lock")


class LogLock:
    """An exclusive lock on a log, taken at once or refused.

    Parameters
    ----------
    log
        The log the lock guards (the lock file is :func:`lock_path` of it).

    Raises
    ------
    HeadprobeError
        When another process (or another open log object of this process) holds the lock.
    """

    def __init__(self, log: str | Path) -> None:
        self.log = Path(log)
        self.path = lock_path(log)
        self._fd: int | None = None
        self._acquire()

    def _acquire(self) -> None:
        while True:
            self._made = self._make_folders()
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:     # the folder was removed between making it and opening the lock
                continue
            except OSError as exc:
                self._remove_made_folders()
                what = ("is a folder, not a lock file; remove it if no run writes to the log"
                        if isinstance(exc, IsADirectoryError) else f"cannot be opened ({exc.strerror})")
                raise HeadprobeError(f"{self.log}: cannot lock the log: {self.path} {what}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = "this process" if holder == os.getpid() else f"process {holder}" if holder else "another process"
                raise HeadprobeError(
                    f"{self.log}: in use by {who} (lock {self.path}); wait for that run to finish, or write "
                    "elsewhere"
                ) from None
            except OSError as exc:
                os.close(fd)
                raise HeadprobeError(f"{self.log}: cannot lock the log {self.path} ({exc.strerror})") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:   # the holder released (and removed) the file between our open and our flock
                os.close(fd)
                continue
            break
        previous = _read_pid(fd)
        if previous and previous != os.getpid():
            if _alive(previous):
                why = ("is running but does not hold it (its process id was reused, or the lock file was copied "
                       "from elsewhere)")
            else:
                why = "no longer holds it (it ended without releasing the lock)"
            warnings.warn(f"{self.log}: taking over the lock {self.path} left by process {previous}, which {why}",
                          RuntimeWarning, stacklevel=4)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:                 # a full disk: not even the process id fits
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os.close(fd)
            self._remove_made_folders()
            raise HeadprobeError(f"{self.log}: cannot write its lock file {self.path} ({exc.strerror})") from None
        self._fd = fd

    def _make_folders(self) -> list[Path]:
        """Create the lock's missing folders; the ones made, deepest first (removed again on release when
        no file went into them)."""
        missing = missing_folders(self.path.parent)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HeadprobeError(f"{self.log}: cannot create its folder ({exc.strerror})") from None
        return missing

    def _remove_made_folders(self) -> None:
        # only empty folders: a log or a result written there stays
        remove_empty_folders(getattr(self, "_made", []))

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and drop the lock (the file goes first, so no one locks a removed file)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None
        self._remove_made_folders()

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.release()


def _alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    return True


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
