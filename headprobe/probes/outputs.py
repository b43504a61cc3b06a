"""The files of a profiling run: where its trial logs and profiles go, and the one writer of profiles.

A pass's log is ``<stem>.<pass>[.shard<i>of<n>].trials.jsonl`` and each of its kinds' profile
``<stem>.<kind>.json`` (:func:`profile_path`). Every profile headprobe writes from a trial log goes through
:func:`profiles_to_write` and :func:`write_profiles`: after a run's pass, at rank 0 of a ``torchrun``
launch, and when shard logs are merged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HeadprobeError, param
from ..files.overwrite import check_overwrite
from ..files.trial_log import read_log_records, settings_diff
from ..models.registry import model_slug
from ..profile import Profile
from .aggregate import profiles_from_log
from .approximation import approximation_record


@dataclass(frozen=True)
class ProfileOutputs:
    """The files a profiling run writes, by name (none of them need exist yet).

    Attributes
    ----------
    out_dir
        The folder they go in.
    logs
        Pass name → its trial log (``<stem>.<pass>[.shard<i>of<n>].trials.jsonl``).
    profiles
        Profile kind → its profile (``<stem>.<kind>.json``); empty for a shard run, which writes logs only.
    """

    out_dir: Path
    logs: dict[str, Path]
    profiles: dict[str, Path]


def check_name(name: str | None) -> None:
    """Refuse a file-name stem that is not one plain name: empty, or holding a path separator (``/``,
    ``\\``) or a NUL, which would put the files outside the output folder or fail to name one.

    Raises
    ------
    HeadprobeError
        Naming ``name``.
    """
    if name is None:
        return
    if not isinstance(name, str) or not name.strip():
        raise HeadprobeError(f"{param('name', name)}: expected a file-name stem, found nothing")
    if any(c in name for c in "/\\\0"):
        raise HeadprobeError(f"{param('name', name)}: expected a plain file-name stem (no path separator or "
                             f"NUL character); the files go in {param('out_dir')}")


def profile_stem(name: str | None, model_name: str) -> str:
    """File-name stem of a run's logs and profiles: ``name``, else the model's slug."""
    return name or model_slug(model_name)


def profile_path(out_dir: str | Path, stem: str, kind: str) -> Path:
    """Where the profile of ``kind`` goes: ``<out_dir>/<stem>.<kind>.json``."""
    return Path(out_dir) / f"{stem}.{kind}.json"


def log_path(out_dir: str | Path, stem: str, pass_name: str, shard: tuple[int, int] | None) -> Path:
    """A pass's trial log: ``<out_dir>/<stem>.<pass>[.shard<i>of<n>].trials.jsonl``."""
    shard_suffix = f".shard{shard[0]}of{shard[1]}" if shard else ""
    return Path(out_dir) / f"{stem}.{pass_name}{shard_suffix}.trials.jsonl"


def profile_made_by_log(profile_path: Path, log_path: Path) -> bool:
    """Whether the profile at ``profile_path`` was made from the trial log at ``log_path``: its probe
    settings are the log's (shard, batch size, device and version aside; ``approximation`` is written from
    them)."""
    if not log_path.exists():
        return False
    try:
        settings, _ = read_log_records(log_path)
        probe = Profile.load(profile_path).probe
    except (HeadprobeError, OSError):
        return False
    ours = {k: v for k, v in settings.items() if k != "probes"}
    return not settings_diff(ours, {k: v for k, v in probe.items() if k not in ("kind", "approximation")})


def profiles_to_write(settings: dict[str, Any], records: list[dict[str, Any]], out_dir: str | Path,
                      stem: str, missing: int = 0) -> list[tuple[Profile, Path]]:
    """The profiles a pass's log makes (averaged by its pass, ``settings["pass"]``) and the files they go to.

    Parameters
    ----------
    missing
        Trials of the grid no log held (a partial merge): recorded as ``trials.missing``.

    Raises
    ------
    NoPassingTrialsError
        When the pass can make no profile of the log (no trial passed its gate).
    """
    planned = []
    for profile in profiles_from_log(settings, records):
        if missing:
            profile.trials["missing"] = missing
        approximation = approximation_record(settings, profile.kind)
        if approximation is not None:
            profile.probe["approximation"] = approximation
        planned.append((profile, profile_path(out_dir, stem, profile.kind)))
    return planned


def replaces_own_profile(force: bool, resume: bool, path: Path, log: Path | None) -> bool:
    """Whether a run may replace the profile at ``path`` when it writes: with ``force``, or with ``resume``
    when the trial log ``log`` made it; any other profile there (another run's) is refused as it is written."""
    return force or (resume and log is not None and profile_made_by_log(path, log))


def write_profiles(planned: list[tuple[Profile, Path]], overwrite: bool | Callable[[Path], bool]) -> list[Path]:
    """Write ``planned`` profiles; the one place headprobe writes a profile from trial logs.

    Parameters
    ----------
    overwrite
        Whether an existing file may be replaced: one answer for all, or one per path (a run's
        :func:`replaces_own_profile`). Every file that may not be replaced is checked before any is
        written (so nothing is written unless everything can be), and again as it is written: a file that
        another run wrote in between is refused, not replaced (:meth:`~headprobe.profile.Profile.save`).

    Raises
    ------
    HeadprobeError
        An existing file that may not be replaced, naming it.
    """
    allowed = {path: bool(overwrite(path) if callable(overwrite) else overwrite) for _, path in planned}
    for _, path in planned:
        if not allowed[path]:
            check_overwrite(path, False, hint=f"or choose another {param('out_dir')}")
    for profile, path in planned:
        profile.save(path, force=allowed[path])
    return [path for _, path in planned]
