"""Panels: the page's components, one builder per panel, laid out by ``app.py``. Element ids are
a contract (browser tests and users' scripts find components by them). Modules: ``page_panels``,
``settings_panel``, ``results_panel``, ``server_panels``, ``tour``, ``requests_table``,
``knob_widgets``."""

__all__ = [
    "page_panels",
    "settings_panel",
    "results_panel",
    "server_panels",  # its hover text goes to the page's script (host.launch)
    "tour",
]
