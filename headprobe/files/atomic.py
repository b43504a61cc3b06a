"""Writing files and folders whole: a temporary beside the target, then one step that puts it in place.

A reader never sees half a file, an interrupted write never destroys the previous file, and a write
that fails (a full disk, a read-only folder) ends in one line naming the file and leaves no temporary
behind. Where a result must not replace another (``overwrite=False``), the step that puts it in place
is itself the check: the temporary is hard-linked to the target name, which fails if anything holds
that name, so of two runs writing the same output the second is refused even when both checked
before either wrote. Temporaries get the mode of any new file (``0o666`` less the umask; folders
``0o777``), so what is put in place is as readable as a file the user would have created.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from ..errors import HeadprobeError, param

#: ``os.link`` errors of file systems without hard links: the name is then reserved by an exclusive create.
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS, errno.EXDEV,
                  errno.EACCES}
#: The hint of a refusal at the moment an output is put in place: another run wrote it meanwhile.
_WRITTEN_MEANWHILE = "(it was written while this run worked; nothing was replaced)"


def exists_message(path: str | os.PathLike, hint: str = "") -> str:
    """The refusal of an output that exists: ``PATH exists; pass --force to overwrite it``."""
    return f"{path} exists; pass {param('force', True)} to overwrite it{' ' + hint if hint else ''}"


def dangling_link(path: Path) -> bool:
    """Whether ``path`` is a symbolic link to nothing (``exists()`` is false, yet the name is taken)."""
    return path.is_symlink() and not path.exists()


def dangling_message(path: Path, hint: str = "") -> str:
    """The refusal of an output name held by a symbolic link that points at nothing."""
    return (f"{path} is a symbolic link to {os.readlink(path)}, which does not exist; remove the link or pass "
            f"{param('force', True)} to replace it{' ' + hint if hint else ''}")


def blocking_file(path: Path) -> Path | None:
    return next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)


def make_output_dir(path: str | os.PathLike) -> Path:
    """Create the folder ``path`` (and its parents) for outputs, or refuse in one line saying why not."""
    path = Path(path) if str(path) else Path(".")
    blocking = blocking_file(path)
    if blocking is not None:
        raise HeadprobeError(f"{path}: cannot create the output folder ({blocking} is a file, not a folder)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HeadprobeError(f"{path}: cannot create the output folder ({exc.strerror})") from exc
    return path


def create_temp_beside(path: str | os.PathLike) -> tuple[int, Path]:
    """Create a new, empty temporary file in ``path``'s folder (made if missing): ``(fd, temp_path)``.

    Unlike ``tempfile.mkstemp`` (mode ``0o600``), the file gets the mode of any new file, ``0o666`` less
    the process umask, so a file renamed from it onto ``path`` has the permissions the user expects.

    Raises
    ------
    HeadprobeError
        When the folder cannot be created or written.
    """
    path = Path(path)
    parent = make_output_dir(path.parent)
    try:
        while True:
            tmp = parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
            except FileExistsError:
                continue
    except OSError as exc:
        raise HeadprobeError(f"{path}: cannot write ({exc.strerror})") from exc


def missing_folders(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first (what writing there makes)."""
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove the folders a failed write made, deepest first, as long as they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def remove_quietly(path: Path) -> None:
    """Remove a temporary file or folder; a failure (a read-only folder, say) is not reported."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def put_in_place(tmp: Path, path: Path, overwrite: bool, hint: str = "") -> None:
    """Move the finished temporary ``tmp`` to ``path``.

    ``overwrite``: replace whatever file is there (one rename). Otherwise the name must be free at this
    moment: ``tmp`` is hard-linked to it (or, on a file system without hard links, the name is reserved
    by an exclusive create and ``tmp`` renamed onto the reservation), and an existing ``path`` is refused
    and left as it is. ``tmp`` is gone afterwards either way.

    Raises
    ------
    HeadprobeError
        ``path`` exists (without ``overwrite``).
    OSError
        The move failed for another reason.
    """
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        remove_quietly(tmp)
        if dangling_link(path):
            raise HeadprobeError(dangling_message(path)) from None
        raise HeadprobeError(exists_message(path, hint or _WRITTEN_MEANWHILE)) from None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            remove_quietly(tmp)
            raise HeadprobeError(exists_message(path, hint or _WRITTEN_MEANWHILE)) from None
        os.replace(tmp, path)
        return
    remove_quietly(tmp)


def _write_synced(fd: int, write: Callable[[IO[bytes]], Any]) -> None:
    """``write(handle)`` into the open file ``fd``, flushed to disk before it is closed."""
    with os.fdopen(fd, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


@contextlib.contextmanager
def _undone_on_failure(target: Path, tmp: Path, made: list[Path]) -> Iterator[None]:
    """Inside the block a temporary ``tmp`` is written for ``target``; if the block fails, the temporary and
    the folders made for it (``made``) are removed, and an ``OSError`` becomes one line naming ``target``."""
    try:
        yield
    except BaseException as exc:
        remove_quietly(tmp)
        remove_empty_folders(made)
        if isinstance(exc, OSError):
            raise HeadprobeError(f"{target}: cannot write ({exc.strerror or exc})") from exc
        raise


def write_file_atomically(path: str | os.PathLike, write: Callable[[IO[bytes]], None], overwrite: bool = True,
                          hint: str = "") -> Path:
    """Write a file whole: ``write(handle)`` fills a temporary beside ``path``, which is then put in place
    (:func:`put_in_place`).

    Raises
    ------
    HeadprobeError
        ``path`` exists (without ``overwrite``), or it cannot be written: ``PATH: cannot write (No space
        left on device)``. No temporary is left behind.
    """
    path = Path(path)
    made = missing_folders(path.parent)
    try:
        fd, tmp = create_temp_beside(path)
    except HeadprobeError:
        remove_empty_folders(made)
        raise
    with _undone_on_failure(path, tmp, made):
        _write_synced(fd, write)
        put_in_place(tmp, path, overwrite, hint)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, overwrite: bool = True, hint: str = "") -> Path:
    """Write ``text`` to ``path`` whole (temporary file in the same folder, then put in place).

    Parameters
    ----------
    overwrite
        Replace an existing file; ``False`` refuses one that exists when the file is put in place.
    """
    data = text.encode("utf-8")
    return write_file_atomically(path, lambda handle: handle.write(data), overwrite, hint)


def write_folder_atomically(folder: str | os.PathLike, files: Mapping[str, str | bytes], overwrite: bool = False,
                            hint: str = "") -> Path:
    """Write the files ``{name: content}`` as the folder ``folder``, whole.

    A new folder is written as a temporary folder beside it and renamed into place, so a failed write (a
    full disk) leaves no folder, and nothing that blocks the rerun. Into an existing empty folder the
    files go one by one, each whole, and a failure takes out those already written. An existing
    non-empty folder is refused without ``overwrite``; with it, each file is replaced whole and the
    folder's other files stay.

    Raises
    ------
    HeadprobeError
        The folder exists and holds files (without ``overwrite``), or it cannot be written.
    """
    folder = Path(folder)
    data = {name: content.encode("utf-8") if isinstance(content, str) else content for name, content in files.items()}
    if folder.is_dir():
        if any(folder.iterdir()) and not overwrite:
            raise HeadprobeError(exists_message(folder, hint))
        # the user's own folder (it may be a mount point): the files go in one by one, and a new folder's
        # files are taken out again when one of them fails
        empty = not any(folder.iterdir())
        written: list[Path] = []
        try:
            for name, content in data.items():
                written.append(write_file_atomically(folder / name, lambda handle, c=content: handle.write(c),
                                                     overwrite, hint))
        except BaseException:
            if empty:
                for path in written:
                    remove_quietly(path)
            raise
        return folder
    if folder.exists() and not folder.is_dir():
        if not overwrite:
            raise HeadprobeError(exists_message(folder, hint))
        raise HeadprobeError(f"{folder}: is a file; expected a folder to write into")
    made = missing_folders(folder.parent)
    parent = make_output_dir(folder.parent)
    tmp = parent / f".{folder.name}.{secrets.token_hex(4)}.tmp"
    with _undone_on_failure(folder, tmp, made):
        os.mkdir(tmp, 0o777)
        for name, content in data.items():
            fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            _write_synced(fd, lambda handle, c=content: handle.write(c))
        try:
            os.rename(tmp, folder)          # replaces an empty folder; refused over one that holds files
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise HeadprobeError(exists_message(folder, hint or _WRITTEN_MEANWHILE)) from None
            raise
    return folder
