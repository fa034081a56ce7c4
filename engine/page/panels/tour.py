"""The guided tour: short plain-words explanations, each pointing at the live chart that shows it.

The text lives in ``assets/tour.json`` (a list of ``{"title", "text", "chart", "chart_name",
"setup"}``, ``chart`` being the ``elem_id`` of a chart on the page and ``setup`` a setup link's
query, ``?preset=...``, as docs/hosting.md's tour hands out), so a teacher can edit it without
code. Each step links to its setup: one click opens the page set up for it.
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
    setup: str  # a setup link's query (``engine.page.inputs.page_io``), e.g. "?preset=seed&slots=3"

    def markdown(self) -> str:
        """The step's text, a link that opens the page set up for it and one that scrolls the
        page to its chart."""
        return (
            f"{self.text}\n\n→ [Set this up]({self.setup}) (in a new tab; press Run there), "
            f"then see it in [{self.chart_name}](#{self.chart})."
        )


def load_tour(path: Path = TOUR_PATH) -> list[TourStep]:
    """The tour's steps, in order. Raises ValueError when a step lacks a field."""
    steps = []
    for i, raw in enumerate(json.loads(path.read_text(encoding="utf-8")), start=1):
        try:
            fields = (raw["title"], raw["text"], raw["chart"], raw["chart_name"], raw["setup"])
            steps.append(TourStep(*fields))
        except KeyError as missing:
            raise ValueError(f"{path.name} step {i} lacks {missing}.") from None
    return steps


def step_selector(number: int) -> Callable[[], gr.Walkthrough]:
    """A click handler that moves the tour to step ``number`` (1-based)."""
    return lambda: gr.Walkthrough(selected=number)
