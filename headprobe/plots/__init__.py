"""Plots of every stage: head heatmaps, side-by-side comparisons, layer-retention curves, budget maps,
needle grids, accuracy against cache memory, ablation bars, head-ranking stability. PNG by default, SVG on request."""

from .eval_figures import ablation_bars, accuracy_vs_memory, needle_grid, ruler_vs_memory
from .profile_figures import (
           PLOT_FORMATS,
           budget_heatmap,
           compare_heatmaps,
           head_heatmap,
           retention_curves,
           save_figure,
           spearman,
)
from .stability import jaccard_curve, stability_figure

__all__ = [
           "PLOT_FORMATS",
           "ablation_bars",
           "accuracy_vs_memory",
           "budget_heatmap",
           "compare_heatmaps",
           "head_heatmap",
           "jaccard_curve",
           "needle_grid",
           "retention_curves",
           "ruler_vs_memory",
           "save_figure",
           "spearman",
           "stability_figure",
]
