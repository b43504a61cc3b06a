"""One entry point over the allocators, profile discovery, and a short text summary of a budget map."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..budget_map import BudgetMap
from ..errors import FileFormatError, HeadprobeError
from ..models.identity import ModelIdentity
from ..paths import shipped_profiles_dir, user_profiles_dir
from ..profile import Profile
from .allocator import DEFAULT_HEAD_KIND
from .options import CapacityOptions
from .registry import ALLOCATORS, DEFAULT_BETA, NEEDS, Source, check_allocator_options

#: The method names, in the order help texts list them (as registered when headprobe was imported).
METHODS = tuple(ALLOCATORS)


@dataclass
class FoundProfile:
    """A profile file found on disk."""

    path: Path
    profile: Profile


def allocate(method: str = "headkv", profiles: Sequence[Profile] = (), model: ModelIdentity | None = None, *,
             capacity: int | None = 128, window: int = 8, sink: int = 0, ratio: float | None = None,
             prompt_len: int | None = None, clamp: bool = False, source_paths: Sequence[str | None] | None = None,
             **options: Any) -> BudgetMap:
    """Allocate a budget map with the named method (a key of :data:`~.registry.ALLOCATORS`).

    Parameters
    ----------
    method
        ``"headkv"`` (one head-score profile), ``"dynamickv"`` (one layer-retention profile),
        ``"combined"`` (both, in either order), ``"uniform"`` or ``"pyramid"`` (no profile needed).
    profiles
        The profiles the method reads; every one must fit ``model``.
    model
        The model to allocate for (default: the first profile's model).
    capacity, window, sink, ratio, prompt_len, clamp
        What every method reads (:class:`~.options.CapacityOptions`).
    source_paths
        The file each profile was loaded from, recorded in the map's ``method.sources``.
    **options
        The method's own options, the fields of its options dataclass (``Allocator.options``):
        ``beta``, ``temperature``, ``reduction``, ``allow_fallback`` (headkv, combined), ``compat``
        (headkv), ``task`` (dynamickv, combined), ``taper`` (pyramid). ``None`` leaves an option at
        its default.

    Raises
    ------
    HeadprobeError
        Unknown method, an option the method does not read, bad values, missing or wrong profiles, or
        a profile of another model.
    """
    allocator = ALLOCATORS.get(method)
    if allocator is None:
        raise HeadprobeError(f"unknown allocation method {method!r}; choose one of {', '.join(ALLOCATORS)}")
    chosen = check_allocator_options(allocator, {k: v for k, v in options.items() if v is not None})
    capacity_options = CapacityOptions(capacity=capacity, ratio=ratio, prompt_len=prompt_len, clamp=clamp,
                                       window=window, sink=sink)
    profiles = list(profiles)
    paths = list(source_paths) if source_paths is not None else [None] * len(profiles)
    paths += [None] * (len(profiles) - len(paths))
    if model is None:
        if not profiles:
            raise HeadprobeError(f"method {method} needs a model (or a profile to take it from)")
        model = profiles[0].model
    for p in profiles:
        p.model.check_fits(model, what=f"{p.kind} profile")
    sources = _match_needs(allocator.needs, list(zip(profiles, paths[:len(profiles)], strict=True)))
    if sources is None:
        kinds = " ".join(allocator.default_kinds)
        raise HeadprobeError(f"method {method} needs " + " and ".join(NEEDS[n].words for n in allocator.needs)
                             + f"; make one with `headprobe profile --probe {kinds}`")
    return allocator.run(model, sources, capacity_options, chosen)


def _provides(profile: Profile, need: str) -> bool:
    return profile.query_heads is not None if need == "head_scores" else bool(profile.retention)


def _match_needs(needs: Sequence[str], given: list[Source]) -> list[Source] | None:
    """One given profile per need, in the order of ``needs``; ``None`` when a need has none.

    A profile that provides only one need is preferred for it, and each profile serves one need
    while another fits.
    """
    chosen: list[Source] = []
    for need in needs:
        fits = [s for s in given if _provides(s[0], need)]
        unused = [s for s in fits if all(s[0] is not c[0] for c in chosen)]
        only = [s for s in unused if not any(_provides(s[0], o) for o in needs if o != need)]
        pick = only or unused or fits
        if not pick:
            return None
        chosen.append(pick[0])
    return chosen


def profiles_for_method(method: str, model: ModelIdentity | str,
                        dirs: Sequence[Path] | None = None) -> list[FoundProfile]:
    """The newest profiles of the kinds ``method`` reads when none is given (see :func:`newest_profile`).

    ``model`` is an identity or a bare model name (when its config cannot be read); after the first
    profile, the others are looked up for that profile's model.
    """
    if method not in ALLOCATORS:
        raise HeadprobeError(f"unknown allocation method {method!r}; choose one of {', '.join(ALLOCATORS)}")
    found: list[FoundProfile] = []
    for kind in ALLOCATORS[method].default_kinds:
        found.append(newest_profile(found[0].profile.model if found else model, kind, dirs))
    return found


def profile_search_dirs() -> list[Path]:
    """Where :func:`find_profiles` looks: the user's profiles (:func:`~headprobe.paths.user_profiles_dir`,
    where ``headprobe profile`` writes by default), ``./profiles`` (the working directory), then the
    shipped ones. Folders that do not exist are left out."""
    dirs = [user_profiles_dir(), Path.cwd() / "profiles", shipped_profiles_dir()]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and all(d.resolve() != o.resolve() for o in out):
            out.append(d)
    return out


def find_profiles(model: ModelIdentity | str, kind: str = DEFAULT_HEAD_KIND,
                  dirs: Sequence[Path] | None = None) -> list[FoundProfile]:
    """Profiles of ``kind`` for ``model``, newest first (by ``created``; local before shipped on ties).

    ``model`` is an identity (matched by fingerprint) or a bare model name (matched by name, when the
    model's config cannot be read). Files that are not valid profiles are skipped.
    """
    found: list[tuple[str, int, FoundProfile]] = []
    for rank, d in enumerate(dirs if dirs is not None else profile_search_dirs()):
        for path in sorted(Path(d).glob("*.json")):
            try:
                prof = Profile.load(path)
            except (HeadprobeError, OSError, ValueError):
                continue
            if prof.kind != kind:
                continue
            ok = prof.model.fingerprint == model.fingerprint if isinstance(model, ModelIdentity) \
                else prof.model.name == model
            if ok:
                found.append((prof.created, -rank, FoundProfile(path, prof)))
    found.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [f for _, _, f in found]


def newest_profile(model: ModelIdentity | str, kind: str = DEFAULT_HEAD_KIND,
                   dirs: Sequence[Path] | None = None) -> FoundProfile:
    """The newest profile of ``kind`` for ``model``; a one-line error saying how to make one if none."""
    found = find_profiles(model, kind, dirs)
    if not found:
        name = model.name if isinstance(model, ModelIdentity) else model
        where = ", ".join(str(d) for d in (dirs if dirs is not None else profile_search_dirs())) or "./profiles"
        raise HeadprobeError(f"no {kind} profile of {name} found in {where}; make one with "
                             f"`headprobe profile --probe {kind}` or give a profile file")
    return found[0]


def load_profile(path: str | Path) -> Profile:
    """Load a profile, with a hint when the file is a budget map instead."""
    try:
        return Profile.load(path)
    except FileFormatError as exc:
        if exc.field == "format":
            raise FileFormatError(path, "format", f"{exc.expected}: allocation reads headprobe profiles "
                                  "(import other tools' files with `headprobe import`)") from None
        raise


def summarize(bm: BudgetMap) -> str:
    """A few lines: method and parameters, total, min/median/max per head, per-layer totals."""
    b = np.asarray(bm.budgets, dtype=np.int64)
    m = bm.method
    unit = "KV head" if bm.granularity == "kv_head" else "query head"
    allocator = ALLOCATORS.get(m["allocator"])
    # a recorded key under an option's name: PyramidKV's taper is recorded as ``beta``
    shown = {i.record: i.name for i in allocator.options.infos()} if allocator is not None else {}
    params = ", ".join(f"{shown.get(k, k)} {m[k]}" for k in ("beta", "capacity", "ratio", "window", "sink",
                                                            "temperature", "reduction", "compat", "clamped_to")
                       if m.get(k) is not None)
    flat = np.sort(b.ravel())
    lines = [
        f"{bm.model.name}: {m['allocator']} ({params})",
        (f"total {int(b.sum())} tokens over {b.shape[0]} layers x {b.shape[1]} {unit}s; per {unit}: "
        f"min {int(flat[0])}, median {int(flat[len(flat) // 2])}, max {int(flat[-1])}"),
        "per-layer totals: " + " ".join(str(int(x)) for x in b.sum(axis=1)),
    ]
    return "\n".join(lines)


__all__: Sequence[str] = ("DEFAULT_BETA", "METHODS", "FoundProfile", "allocate", "find_profiles", "load_profile",
                          "newest_profile", "profile_search_dirs", "profiles_for_method",
                          "summarize")

