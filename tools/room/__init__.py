"""The workshop room's people, for ``python -m tools.room_load``.

``session``: one person's Run through the page's API (``gradio_client``), and what they were
told; ``browsers``: people on the page itself, in headless Chromium. May import the core;
imported by ``tools.room_load`` and ``tools.page_gap`` (which reads the page's status line as a
session does).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = ["session", "browsers"]
