"""Plots: rendered images with the expected axes, titles and content, for synthetic, imported and
shipped profiles."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
from conftest import SMOLLM2_IDENTITY

from headprobe.allocation.api import allocate
from headprobe.errors import HeadprobeError
from headprobe.plots.profile_figures import (
    budget_heatmap,
    compare_heatmaps,
    head_heatmap,
    retention_curves,
    save_figure,
    spearman,
)
from headprobe.profile import LayerRetention, Profile, reduce_groups

SMOL = SMOLLM2_IDENTITY
REPO = Path(__file__).resolve().parents[2]
REF = REPO.parent / "shared" / "reference"
SHIPPED = sorted((REPO / "profiles").glob("*.json"))


def heads(seed=0, kind="retrieval_reasoning") -> Profile:
    q = (np.random.default_rng(seed).random((30, 9)) ** 3).tolist()
    return Profile(kind=kind, model=SMOL, probe={}, trials={"total": 5, "passed": 5}, query_heads=q,
                   kv_heads=reduce_groups(q, 3, "mean"))


def retention() -> Profile:
    rng = np.random.default_rng(1)
    tasks = {}
    for t in ("single_doc_qa", "summarisation", "code"):
        m = rng.random(30) + 0.1
        tasks[t] = LayerRetention(mean=(m / m.sum()).tolist(), std=[0.005] * 30, samples=6)
    return Profile(kind="layer_retention", model=SMOL, probe={}, trials={"total": 18, "passed": 18}, retention=tasks)


def rendered(path: Path) -> np.ndarray:
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 400
    gray = img[..., :3].mean(axis=2)
    assert gray.std() > 0.05                  # not a blank canvas
    assert (gray < 0.5).mean() > 0.02         # a real amount of dark (drawn) pixels
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50  # a colour map, not two colours
    return img


def test_head_heatmap_axes_title_and_top_k(tmp_path):
    p = heads()
    fig = head_heatmap(p, granularity="query", top_k=3)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "query head" and ax.get_ylabel() == "layer"
    title = ax.get_title()
    top = p.top_heads(3)
    assert "SmolLM2-135M-Instruct" in title and "retrieval-reasoning" in title
    assert f"{top[0][0]}-{top[0][1]}" in title
    assert [t.get_text() for t in ax.texts] == ["1", "2", "3"]
    assert ax.collections[0].get_array().size == 30 * 9
    rendered(save_figure(fig, tmp_path / "h.png"))
    fig = head_heatmap(p, granularity="kv")
    assert fig.axes[0].get_xlabel() == "KV head" and fig.axes[0].collections[0].get_array().size == 90
    out = save_figure(fig, tmp_path / "h", fmt="svg")
    assert out.suffix == ".svg" and out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()


def test_compare_shares_one_colour_scale_and_reports_rank_correlation(tmp_path):
    a, b = heads(0, "retrieval"), heads(0, "retrieval_reasoning")
    b.query_heads = (np.array(b.query_heads) * 10).tolist()
    fig = compare_heatmaps(a, b)
    meshes = [ax.collections[0] for ax in fig.axes[:2]]
    assert meshes[0].get_clim() == meshes[1].get_clim()
    assert "Spearman ρ = 1.00" in fig._suptitle.get_text()
    assert [ax.get_title() for ax in fig.axes[:2]] == ["retrieval", "retrieval-reasoning"]
    c = heads(7)
    rho = spearman(np.array(a.query_heads), np.array(c.query_heads))
    assert abs(rho) < 0.3
    assert f"{rho:.2f}" in compare_heatmaps(a, c)._suptitle.get_text()
    rendered(save_figure(fig, tmp_path / "c.png"))


def test_retention_curves_one_line_per_task_with_bands(tmp_path):
    fig = retention_curves(retention())
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:3] == ["single_doc_qa (n=6)", "summarisation (n=6)", "code (n=6)"]
    assert len(ax.collections) == 3  # spread bands
    assert ax.get_xlabel() == "layer" and ax.get_ylabel() == "share of retained tokens"
    assert "layer retention" in ax.get_title()
    rendered(save_figure(fig, tmp_path / "r.png"))
    with pytest.raises(HeadprobeError, match="no layer retention"):
        retention_curves(heads())


def test_budget_heatmap_with_layer_totals(tmp_path):
    bm = allocate("headkv", [heads()], beta=1.2)
    fig = budget_heatmap(bm)
    heat, bar = fig.axes[0], fig.axes[1]
    assert heat.get_xlabel() == "KV head" and bar.get_xlabel() == "tokens per layer"
    widths = [p.get_width() for p in bar.patches]
    assert widths == bm.per_layer
    assert "headkv" in fig._suptitle.get_text() and str(bm.total) in fig._suptitle.get_text()
    rendered(save_figure(fig, tmp_path / "b.png"))
    with pytest.raises(HeadprobeError, match="exists; pass force=True"):
        save_figure(budget_heatmap(bm), tmp_path / "b.png")


@pytest.mark.skipif(not REF.is_dir(), reason="../shared/reference not present")
def test_plots_of_imported_reference_files(tmp_path):
    from headprobe.tool_files.auto import import_file
    r = import_file(REF / "headkv" / "Meta-Llama-3-8B-Instruct_retrieval_heads.json")
    r2 = import_file(REF / "headkv" / "Meta-Llama-3-8B-Instruct_retrieval_reasoning_heads.json")
    fig = head_heatmap(r2)
    assert "15-30" in fig.axes[0].get_title()
    rendered(save_figure(fig, tmp_path / "r2.png"))
    fig = compare_heatmaps(r, r2)
    assert "Meta-Llama-3-8B-Instruct" in fig._suptitle.get_text()
    rendered(save_figure(fig, tmp_path / "cmp.png"))
    duo = import_file(REF / "duo-attention" / "Mistral-7B-Instruct-v0.2")
    rendered(save_figure(head_heatmap(duo, granularity="kv"), tmp_path / "duo.png"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_plots_of_shipped_profiles(path, tmp_path):
    p = Profile.load(path)
    figs = []
    if p.query_heads is not None:
        figs += [head_heatmap(p), head_heatmap(p, granularity="kv")]
    if p.retention:
        figs.append(retention_curves(p))
    assert figs
    for i, fig in enumerate(figs):
        assert all(ax.get_xlabel() for ax in fig.axes if ax.get_label() != "<colorbar>")
        rendered(save_figure(fig, tmp_path / f"{i}.png"))


def test_scores_near_the_float_range_draw_scaled_with_the_scale_named(tmp_path):
    import dataclasses

    import headprobe

    prof = headprobe.Profile.load(Path(__file__).resolve().parents[2] / "profiles" / "smollm2-135m.retrieval.json")
    layers, heads = len(prof.query_heads), len(prof.query_heads[0])
    for values in ([[1e308] * heads for _ in range(layers)],
                   [[1e308 if (i + j) % 2 else 0.0 for j in range(heads)] for i in range(layers)]):
        fig = headprobe.head_heatmap(dataclasses.replace(prof, query_heads=values))
        fig.savefig(tmp_path / "h.png")
        labels = [ax.get_ylabel() for ax in fig.axes]
        assert "score / 1e+308" in labels


def test_ruler_figure_draws_each_tasks_score_against_the_bytes_held_with_the_full_cache_as_ceiling(tmp_path):
    from ruler_result import ruler_result

    from headprobe.plots.eval_figures import ruler_vs_memory

    fig = ruler_vs_memory(ruler_result())
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
    assert [ax.get_title() for ax in panels] == ["niah_single_1 at 2048", "qa_1 at 2048", "average"]
    ceilings = {ax.get_title(): ax.lines[0] for ax in panels}
    assert ceilings["qa_1 at 2048"].get_ydata()[0] == 50.0 and ceilings["qa_1 at 2048"].get_linestyle() == ":"
    assert ceilings["average"].get_ydata()[0] == 75.0
    lines = {(ax.get_title(), ln.get_label()): ln for ax in panels for ln in ax.lines[1:]}
    snap = lines[("niah_single_1 at 2048", "snapkv")]
    assert list(snap.get_xdata()) == pytest.approx([11.0, 51.0]) and list(snap.get_ydata()) == [50.0, 100.0]
    press = lines[("qa_1 at 2048", "kvpress:snapkv")]                # masks: at 100 % whatever it attends
    assert list(press.get_xdata()) == [100.0, 100.0] and press.get_linestyle() == "--" and press.get_marker() == "s"
    assert snap.get_linestyle() == "-" and snap.get_marker() == "o"
    assert all(ax.get_xscale() == "log" for ax in panels)
    rendered(save_figure(fig, tmp_path / "ruler.png"))
