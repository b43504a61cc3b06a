"""Plots of profiles and budget maps: head heatmaps, side-by-side comparisons, layer-retention curves,
budget maps. PNG by default, SVG on request."""

from .figures import (
           FORMATS,
           budget_heatmap,
           compare_heatmaps,
           head_heatmap,
           retention_curves,
           save_figure,
           spearman,
)

__all__ = ["FORMATS", "budget_heatmap", "compare_heatmaps", "head_heatmap", "retention_curves", "save_figure",
           "spearman"]
