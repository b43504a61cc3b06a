"""The allocation methods by name: what each reads, what it does, and how :func:`~.api.allocate` runs it.

:data:`ALLOCATORS` is the one list of methods; ``allocate(method=...)``, eval settings and the command
line's ``--method`` choices and help all come from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..budget_map import BudgetMap
from ..models.identity import ModelIdentity
from ..probes.registry import profile_kinds
from ..profile import Profile
from .combined import allocate_combined
from .dynamickv_offline import allocate_dynamickv
from .headkv import allocate_headkv
from .pyramid import DEFAULT_PYRAMID_BETA, allocate_pyramid
from .uniform import allocate_uniform

#: HeadKV's β when none is given (headkv and combined).
DEFAULT_BETA = 1.2

_HEAD_SCORE_KINDS = profile_kinds("head_scores")      # the probe passes' kinds whose profiles hold head scores

#: What a method can read from profiles → (the profile kind looked up when none is given, in words).
NEEDS: dict[str, tuple[str, str]] = {
    "head_scores": ("retrieval_reasoning",
                    f"a head-score profile ({', '.join(_HEAD_SCORE_KINDS[:-1])} or {_HEAD_SCORE_KINDS[-1]})"),
    "layer_retention": ("layer_retention", "a layer_retention profile"),
}

#: One profile the method reads, with the path it was loaded from (``None`` when not from a file).
Source = tuple[Profile, str | None]


@dataclass(frozen=True)
class Allocator:
    """One allocation method.

    Attributes
    ----------
    name
        The method name (``allocate(method=...)``, ``--method``).
    needs
        What it reads, one profile each, in order: ``"head_scores"`` and/or ``"layer_retention"``
        (keys of :data:`NEEDS`); empty when the model's shape is enough.
    description
        One line for help texts.
    run
        ``run(model, sources, **parameters) -> BudgetMap``: ``sources`` holds one ``(profile, path)``
        per entry of ``needs``; ``parameters`` are every keyword of :func:`~.api.allocate` after
        ``model`` (each method uses those that apply to it).
    """

    name: str
    needs: tuple[str, ...]
    description: str
    run: Callable[..., BudgetMap]

    @property
    def default_kinds(self) -> tuple[str, ...]:
        """The profile kinds looked up for ``needs`` when no profile is given."""
        return tuple(NEEDS[n][0] for n in self.needs)


def _capacity(parameters: dict[str, Any]) -> dict[str, Any]:
    keys = ("capacity", "window", "sink", "ratio", "prompt_len", "clamp")
    return {k: parameters[k] for k in keys}


def _headkv(model: ModelIdentity, sources: Sequence[Source], **p: Any) -> BudgetMap:
    (profile, path), = sources
    return allocate_headkv(profile, model, beta=DEFAULT_BETA if p["beta"] is None else p["beta"],
                           temperature=p["temperature"], reduction=p["reduction"], compat=p["compat"],
                           allow_fallback=p["allow_fallback"], source_path=path, **_capacity(p))


def _dynamickv(model: ModelIdentity, sources: Sequence[Source], **p: Any) -> BudgetMap:
    (profile, path), = sources
    return allocate_dynamickv(profile, model, task=p["task"], source_path=path, **_capacity(p))


def _combined(model: ModelIdentity, sources: Sequence[Source], **p: Any) -> BudgetMap:
    (heads, heads_path), (layers, layers_path) = sources
    return allocate_combined(heads, layers, model, beta=DEFAULT_BETA if p["beta"] is None else p["beta"],
                             task=p["task"], temperature=p["temperature"], reduction=p["reduction"],
                             allow_fallback=p["allow_fallback"], source_paths=(heads_path, layers_path),
                             **_capacity(p))


def _uniform(model: ModelIdentity, sources: Sequence[Source], **p: Any) -> BudgetMap:
    return allocate_uniform(model, **_capacity(p))


def _pyramid(model: ModelIdentity, sources: Sequence[Source], **p: Any) -> BudgetMap:
    return allocate_pyramid(model, beta=DEFAULT_PYRAMID_BETA if p["beta"] is None else p["beta"], **_capacity(p))


ALLOCATORS: dict[str, Allocator] = {a.name: a for a in [
    Allocator("headkv", ("head_scores",), f"HeadKV: a floor per head plus a pool split by head scores "
              f"(beta, default {DEFAULT_BETA:g}; compat=headkv for HeadKV's own arithmetic)", _headkv),
    Allocator("dynamickv", ("layer_retention",), "DynamicKV offline: layer budgets by layer retention "
              "(task mix), even over each layer's KV heads", _dynamickv),
    Allocator("combined", ("head_scores", "layer_retention"), "DynamicKV layer budgets split inside each "
              "layer by head scores (beta as in headkv)", _combined),
    Allocator("uniform", (), "SnapKV: the same budget for every KV head", _uniform),
    Allocator("pyramid", (), f"PyramidKV: layer budgets falling linearly with depth (beta, default "
              f"{DEFAULT_PYRAMID_BETA:g})", _pyramid),
]}
