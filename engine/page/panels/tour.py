"""The guided tour: short plain-words explanations, each pointing at the live chart that shows it.

The text lives in ``assets/tour.json`` (a list of ``{"title", "text", "chart", "chart_name"}``,
``chart`` being the ``elem_id`` of a chart on the page), so a teacher can edit it without code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

TOUR_PATH = Path(__file__).resolve().parents[3] / "assets" / "tour.json"


@dataclass(frozen=True)
class TourStep:
    title: str
    text: str
    chart: str  # elem_id of the chart the step explains
    chart_name: str

    def markdown(self) -> str:
        """The step's text and a link that scrolls the page to its chart."""
        return f"{self.text}\n\n→ See it in [{self.chart_name}](#{self.chart})."


def load_tour(path: Path = TOUR_PATH) -> list[TourStep]:
    """The tour's steps, in order. Raises ValueError when a step lacks a field."""
    steps = []
    for i, raw in enumerate(json.loads(path.read_text(encoding="utf-8")), start=1):
        try:
            steps.append(TourStep(raw["title"], raw["text"], raw["chart"], raw["chart_name"]))
        except KeyError as missing:
            raise ValueError(f"{path.name} step {i} lacks {missing}.") from None
    return steps


def step_selector(number: int) -> Callable[[], gr.Walkthrough]:
    """A click handler that moves the tour to step ``number`` (1-based)."""
    return lambda: gr.Walkthrough(selected=number)
