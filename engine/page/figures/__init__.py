"""Figures: every chart the page draws, built from a ``Trace`` alone (the only plotly here).
Modules: ``timelines``, ``mask_heatmaps``, ``block_map``, ``serving_metrics``, ``server_lanes``,
``style``, ``kv_pools``."""

__all__ = [
    "timelines",
    "mask_heatmaps",
    "block_map",
    "serving_metrics",
    "server_lanes",
    "style",
]
