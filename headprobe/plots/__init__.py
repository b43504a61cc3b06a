"""Plots of every stage: head heatmaps, side-by-side comparisons, layer-retention curves, budget maps,
needle grids, accuracy against cache memory, ablation bars, head-ranking stability. PNG by default, SVG on request."""
