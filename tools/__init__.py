"""Maintainers' tools, not part of the package: nothing under ``engine/`` imports them.

``room_load``: the workshop room's check, many sessions against one page
(``python -m tools.room_load``); ``page_gap``: the page's ``/run`` timed against the bench
(``python -m tools.page_gap``); ``record_run``: the page's shipped run re-recorded (``make
record``); ``kernel_bench``: the engines' kernels timed against ``F.linear``; ``gpu_check``: the
precision checks on a CUDA machine (``make gpu-check``); ``app_server``: ``app.py`` as a local
server, which these tools and the tests start; ``room``: the room's people, ``gradio_client``
sessions and Playwright browsers. They may import the core and each other; ``gradio_client`` and
Playwright are theirs.
"""

__all__ = [
    "app_server",
    "gpu_check",
    "kernel_bench",
    "page_gap",
    "record_run",
    "room",
    "room_load",
]
