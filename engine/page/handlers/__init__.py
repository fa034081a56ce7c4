"""Handlers: the page's events as plain functions, testable without a browser."""

__all__ = [
    "model_choice",
    "opening",
    "playground",
    "recording",
]
