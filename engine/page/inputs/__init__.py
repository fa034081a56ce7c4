"""Inputs: what a person brings to the page, and what a link hands on."""

__all__ = [
    "presets",
    "page_io",
    "link_query",
    "link_table",
]
