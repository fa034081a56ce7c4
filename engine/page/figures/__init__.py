"""Figures: every chart the page draws, built from a ``Trace`` alone (the only plotly here).

The engines' ``timelines``, ``mask_heatmaps``, the KV ``block_map``, ``serving_metrics`` (latency
CDFs, tokens and KV per step), ``server_lanes``, and their shared ``style`` (colours, sizes,
the empty chart's message, and the nouns and request lists titles and lines count with) and
``kv_pools`` (what 100 % KV use is for each engine). May import the serving core only.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face; ``kv_pools``
serves it from inside.
"""

__all__ = [
    "timelines",
    "mask_heatmaps",
    "block_map",
    "serving_metrics",
    "server_lanes",
    "style",
]
