"""Inputs: what a person brings to the page, and what a link hands on.

Ready-made workloads (``presets``), workload uploads and downloads, and share links
(``page_io``), whose engine settings are short query parameters (``link_query``) and whose edited
table is packed into one (``link_table``). May import the core and ``engine.page.figures``.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "presets",
    "page_io",
    "link_query",
    "link_table",
]
