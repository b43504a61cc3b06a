"""Figures of profiles and budget maps (matplotlib + seaborn; headless, Agg backend).

Every function returns a :class:`matplotlib.figure.Figure` whose title names the model and the probe and
whose axes are labelled; :func:`save_figure` writes it as PNG (default) or SVG.
"""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path

import matplotlib

if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.text import Text

from ..budget_map import BudgetMap
from ..errors import HeadprobeError
from ..files.atomic import write_file_atomically
from ..files.overwrite import check_overwrite
from ..head_ranking import top_heads
from ..profile import Profile

PLOT_FORMATS = ("png", "svg")
_CMAP = "viridis"


def short_model_name(name: str) -> str:
    """A model's name without its hub owner, as figure titles show it (``"HuggingFaceTB/SmolLM2"`` → ``"SmolLM2"``)."""
    return name.split("/")[-1]


def _probe_label(p: Profile) -> str:
    src = p.probe.get("source") if isinstance(p.probe, dict) else None
    label = p.kind.replace("_", "-")
    return f"{label} ({src})" if src else label


def _scores(p: Profile, granularity: str) -> np.ndarray:
    if granularity not in ("query", "kv"):
        raise HeadprobeError(f"granularity must be 'query' or 'kv', got {granularity!r}")
    s = p.query_heads if granularity == "query" else p.kv_heads
    if s is None:
        raise HeadprobeError(f"{p.kind} profile of {short_model_name(p.model.name)} has no head scores to plot")
    return np.asarray(s, dtype=np.float64)


def fit_title(fig: Figure, title: Text, min_fontsize: int = 7, max_lines: int = 3) -> Text:
    """Wrap and, if need be, shrink a title until it lies inside the figure.

    A narrow figure (few heads per layer) cannot hold a long title on one line at the default size.
    Each paragraph of the title is split at word boundaries into at most 1, 2, ... ``max_lines`` lines of
    even length, each tried at the title's size and up to two points smaller; past that the font shrinks
    to ``min_fontsize``. The first form whose drawn extent (measured after the layout engine has placed
    it) lies inside the figure is kept.

    Parameters
    ----------
    title
        The ``Text`` of ``fig.suptitle(...)`` or ``ax.set_title(...)``.
    """
    paragraphs = title.get_text().split("\n")
    size = round(title.get_fontsize())
    tries = [(lines, s) for lines in range(1, max_lines + 1) for s in range(size, max(size - 3, min_fontsize - 1), -1)]
    tries += [(max_lines, s) for s in range(size - 3, min_fontsize - 1, -1)]
    for lines, s in tries:
        title.set_fontsize(s)
        title.set_text("\n".join(_balanced_wrap(p, lines) for p in paragraphs))
        fig.draw_without_rendering()
        box, frame = title.get_window_extent(), fig.bbox
        if box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1:
            return title
    return title


def _balanced_wrap(text: str, lines: int) -> str:
    """``text`` split at spaces into at most ``lines`` lines whose longest is as short as it can be."""
    if lines <= 1 or " " not in text:
        return text
    for width in range(math.ceil(len(text) / lines), len(text) + 1):
        wrapped = textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False)
        if len(wrapped) <= lines:
            return "\n".join(wrapped)
    return text


def _size(layers: int, heads: int, panels: int = 1) -> tuple[float, float]:
    w = min(3.5 + 0.22 * heads, 9) * panels + (1 if panels > 1 else 0)
    h = min(max(3.5, 1.2 + 0.24 * layers), 14)
    return w, h


def _annotate_top(ax, values: np.ndarray, k: int) -> list[tuple[int, int]]:
    if k <= 0:
        return []
    cells = top_heads(values, k)
    for rank, (layer, head) in enumerate(cells, 1):
        ax.add_patch(plt.Rectangle((head, layer), 1, 1, fill=False, edgecolor="red", lw=1.8))
        ax.text(head + 0.5, layer + 0.5, str(rank), ha="center", va="center", color="white", fontsize=8,
                fontweight="bold", bbox={"boxstyle": "round,pad=0.1", "fc": "red", "ec": "none", "alpha": 0.8})
    return cells


#: Values beyond this are drawn divided by the largest (matplotlib's tick arithmetic overflows near 1e308).
_LARGEST_DRAWN = 1e100


def _heat(ax, values: np.ndarray, vmin=None, vmax=None, cbar=True, cbar_label: str = "score"):
    layers, heads = values.shape
    low = float(np.min(values)) if vmin is None else vmin
    high = float(np.max(values)) if vmax is None else vmax
    if not np.isfinite(high - low) or max(abs(low), abs(high)) > _LARGEST_DRAWN:
        # a colour scale's ticks and margins overflow near the float range (scores near 1e308): draw
        # the values divided by the largest one, and say so on the colour bar
        scale = max(abs(low), abs(high))
        values = np.asarray(values, dtype=np.float64) / scale
        vmin = None if vmin is None else vmin / scale
        vmax = None if vmax is None else vmax / scale
        cbar_label = f"{cbar_label} / {scale:.3g}"
    sns.heatmap(values, ax=ax, cmap=_CMAP, vmin=vmin, vmax=vmax, cbar=cbar,
                cbar_kws={"label": cbar_label} if cbar else None,
                xticklabels=max(1, heads // 16), yticklabels=max(1, layers // 16))
    ax.tick_params(labelsize=8)
    ax.set_yticklabels(ax.get_yticklabels(), rotation=0)


def head_heatmap(profile: Profile, granularity: str = "query", top_k: int = 5) -> Figure:
    """Layers × heads heatmap of one profile's scores, the ``top_k`` heads boxed and numbered.

    Parameters
    ----------
    granularity
        ``"query"`` (``[layers][query_heads]``) or ``"kv"`` (``[layers][kv_heads]``).
    """
    s = _scores(profile, granularity)
    fig, ax = plt.subplots(figsize=_size(*s.shape), constrained_layout=True)
    _heat(ax, s)
    top = _annotate_top(ax, s, top_k)
    unit = "query head" if granularity == "query" else "KV head"
    ax.set_xlabel(unit)
    ax.set_ylabel("layer")
    tops = ", ".join(f"{l}-{h}" for l, h in top[:5])
    title = ax.set_title(f"{short_model_name(profile.model.name)}: {_probe_label(profile)} scores per {unit}"
                         + (f"\ntop {len(top)}: {tops}" if top else ""), fontsize=11)
    fit_title(fig, title)
    return fig


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a flat array, tied values sharing the mean of their ranks (as ``scipy.stats.rankdata``)."""
    v = np.ravel(values)
    order = np.argsort(v, kind="stable")
    sorted_v = v[order]
    # first index of each run of equal values, and the run each sorted position belongs to
    starts = np.flatnonzero(np.r_[True, sorted_v[1:] != sorted_v[:-1]])
    run = np.cumsum(np.r_[True, sorted_v[1:] != sorted_v[:-1]]) - 1
    ends = np.r_[starts[1:], v.size]
    ranks = np.empty(v.size, dtype=np.float64)
    ranks[order] = ((starts + 1 + ends) / 2.0)[run]
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two equal-shape arrays (average ranks for ties); NaN when either is
    constant."""
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb) / denom if denom > 0 else float("nan")


def compare_heatmaps(first: Profile, second: Profile, granularity: str = "query", top_k: int = 5,
                     normalise: bool = True) -> Figure:
    """Two profiles of one model side by side on one colour scale, their rank correlation in the title.

    With ``normalise`` each profile's scores are divided by their sum (shares of the total), so probes
    on different scales (retrieval vs retrieval-reasoning) share one colour bar.
    """
    first.model.check_fits(second.model, what=f"{second.kind} profile", include_name=False)
    a, b = _scores(first, granularity), _scores(second, granularity)
    if normalise:
        a = a / a.sum() if a.sum() > 0 else a
        b = b / b.sum() if b.sum() > 0 else b
    vmax = float(max(a.max(), b.max()))
    vmin = float(min(a.min(), b.min(), 0.0))
    fig, axes = plt.subplots(1, 2, figsize=_size(*a.shape, panels=2), constrained_layout=True)
    unit = "query head" if granularity == "query" else "KV head"
    for i, (ax, p, v) in enumerate(zip(axes, (first, second), (a, b), strict=False)):
        _heat(ax, v, vmin=vmin, vmax=vmax, cbar=i == 1, cbar_label="share of total score" if normalise else "score")
        _annotate_top(ax, v, top_k)
        ax.set_title(_probe_label(p), fontsize=10)
        ax.set_xlabel(unit)
        ax.set_ylabel("layer")
    rho = spearman(a, b)
    fit_title(fig, fig.suptitle(f"{short_model_name(first.model.name)}: {_probe_label(first)} vs {_probe_label(second)}, "
                                f"Spearman ρ = {rho:.2f}", fontsize=11))
    return fig


def retention_curves(profile: Profile) -> Figure:
    """Layer-retention share per layer, one line per task type, mean ± std band."""
    if not profile.retention:
        raise HeadprobeError(f"{profile.kind} profile of {short_model_name(profile.model.name)} has no layer retention to plot")
    layers = profile.model.num_layers
    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * layers + 3), 4.2), constrained_layout=True)
    x = np.arange(layers)
    colours = sns.color_palette("tab10", len(profile.retention))
    for colour, (task, r) in zip(colours, profile.retention.items(), strict=False):
        m, s = np.asarray(r.mean), np.asarray(r.std)
        ax.plot(x, m, marker="o", ms=3, lw=1.6, color=colour, label=f"{task} (n={r.samples})")
        ax.fill_between(x, np.maximum(m - s, 0), m + s, color=colour, alpha=0.2)
    ax.axhline(1 / layers, color="grey", ls="--", lw=1, label="uniform")
    ax.set_xlabel("layer")
    ax.set_ylabel("share of retained tokens")
    ax.set_xlim(-0.5, layers - 0.5)
    ax.legend(fontsize=8, frameon=False, ncol=2)
    ax.set_title(f"{short_model_name(profile.model.name)}: layer retention by task (mean ± std)", fontsize=11)
    return fig


def budget_heatmap(bm: BudgetMap, top_k: int = 5) -> Figure:
    """Budget map heatmap (tokens per head) with per-layer totals in a bar panel on the right."""
    b = np.asarray(bm.budgets, dtype=np.float64)
    layers, heads = b.shape
    w, h = _size(layers, heads)
    fig, (ax, bar) = plt.subplots(1, 2, figsize=(w + 2.5, h), constrained_layout=True,
                                  gridspec_kw={"width_ratios": [max(heads, 3), 2.5]}, sharey=False)
    _heat(ax, b, cbar=True, cbar_label="tokens")
    _annotate_top(ax, b, top_k)
    unit = "KV head" if bm.granularity == "kv_head" else "query head"
    ax.set_xlabel(unit)
    ax.set_ylabel("layer")
    totals = b.sum(axis=1)
    bar.barh(np.arange(layers) + 0.5, totals, height=0.8, color="steelblue")
    bar.set_ylim(layers, 0)
    bar.set_xlabel("tokens per layer")
    bar.set_ylabel("layer")
    bar.tick_params(labelsize=8)
    m = bm.method
    params = ", ".join(f"{k}={m[k]}" for k in ("beta", "capacity", "window") if m.get(k) is not None)
    fit_title(fig, fig.suptitle(f"{short_model_name(bm.model.name)}: {m.get('allocator')} budgets ({params}); "
                                f"total {int(b.sum())}", fontsize=11))
    return fig


def save_figure(fig: Figure, path: str | Path, fmt: str | None = None, force: bool = False, dpi: int = 150) -> Path:
    """Save ``fig`` as PNG (default) or SVG (``fmt="svg"`` or a ``.svg`` path); an existing image is
    replaced only with ``force``, checked as the image is put in place (an image another run wrote
    meanwhile is refused, not replaced). The figure is closed afterwards.

    Raises
    ------
    HeadprobeError
        An unknown format, an existing image (without ``force``), or a folder that cannot be written
        (``PATH: cannot write (Read-only file system)``); no temporary file is left behind.
    """
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".") or "png").lower()
    try:
        if fmt not in PLOT_FORMATS:
            raise HeadprobeError(f"plot format must be one of {', '.join(PLOT_FORMATS)}, got {fmt!r}")
        if path.suffix.lstrip(".").lower() != fmt:
            path = path.with_suffix(f".{fmt}")
        check_overwrite(path, force)
        write_file_atomically(path, lambda handle: fig.savefig(handle, format=fmt, dpi=dpi), overwrite=force)
    finally:
        plt.close(fig)
    return path


__all__ = ("PLOT_FORMATS", "budget_heatmap", "compare_heatmaps", "head_heatmap", "retention_curves", "save_figure",
           "spearman")
