"""Panels: the page's components, one builder per panel, laid out by ``app.py``.

Header, requests and downloads (``page_panels``), the settings (``settings_panel``), the results
(``results_panel``), the host's servers (``server_panels``) and the ``tour``. Element ids
(``elem_id``) are a contract: the browser tests and users' scripts find components by them. May
import the core and every page room below it.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``requests_table`` and ``knob_widgets`` (a knob's component) serve it from inside; ``tour`` is
face too, for app.py to wire its "Set this up" buttons, and ``server_panels``, whose hover text
host.launch hands to the page's script.
"""

__all__ = [
    "page_panels",
    "settings_panel",
    "results_panel",
    "server_panels",  # its hover text goes to the page's script (host.launch)
    "tour",
]
