"""The workshop room's people, for ``python -m engine.bench.room_load``.

``session``: one person's Run through the page's API (``gradio_client``), and what they were
told; ``browsers``: people on the page itself, in headless Chromium. May import the rest of
``engine.bench`` and the core; imported by ``engine.bench.room_load`` and ``engine.bench.page_gap``
(which reads the page's status line as a session does).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = ["session", "browsers"]
