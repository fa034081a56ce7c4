"""Handlers: the page's events as plain functions, testable without a browser. Modules:
``playground``, ``recording``, ``opening``, ``model_choice``."""

__all__ = [
    "model_choice",
    "opening",
    "playground",
    "recording",
]
