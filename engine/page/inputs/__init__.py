"""Inputs: what a person brings to the page, and what a link hands on. Modules: ``presets``,
``page_io``, ``link_query``, ``link_table``."""

__all__ = [
    "presets",
    "page_io",
    "link_query",
    "link_table",
]
