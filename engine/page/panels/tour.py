"""The guided tour: short plain-words explanations, each pointing at the live chart that shows it.
Format: docs/page.md, "The presets and tour files".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

import gradio as gr

from engine.knobs import KNOB
from engine.page.figures.style import counted
from engine.page.inputs import link_query, page_io, presets

TOUR_PATH = Path(__file__).resolve().parents[3] / "assets" / "tour.json"


@dataclass(frozen=True)
class TourStep:
    title: str
    text: str
    chart: str  # elem_id of the chart the step explains
    chart_name: str
    setup: str  # a setup link's query (``engine.page.inputs.page_io``), e.g. "?preset=seed&slots=3"

    @property
    def params(self) -> dict[str, str]:
        return dict(parse_qsl(self.setup.removeprefix("?")))

    def markdown(self) -> str:
        """The step's text, what "Set this up" does, a link to its chart, and its setup link."""
        return (
            f"{self.text}\n\n→ **Set this up** sets the page up for this step (nothing runs); "
            f"press Run, then see it in [{self.chart_name}](#{self.chart}). "
            f"To hand it out: [this step's link]({self.setup}) (opens in a new tab)."
        )

    def setup_words(self) -> str:
        """E.g. "“Long prompts” at 2 slots, Token budget 64"."""
        params = self.params
        name = presets.by_slug(params.get("preset", "")) or presets.DEFAULT_PRESET
        slots = int(params.get("slots") or presets.preset_slots(name))
        words = [f"“{name}” at {counted(slots, 'slot')}"]
        for field, knob in link_query.PARAMS.items():
            if knob.url in params:
                words.append(f"{KNOB[field].named} {_value_words(params[knob.url])}")
        return ", ".join(words)


def _value_words(text: str) -> str:
    flag = link_query.FLAG_WORDS.get(text.lower())
    return text if flag is None else ("on" if flag else "off")


def set_up(step: TourStep, precision: link_query.Precision | None = None) -> tuple:
    """What "Set this up" sets: ``from_query(link, whole=True)``, the link's step, the note."""
    params = step.params
    updates = page_io.from_query(params, precision, whole=True)
    kept = page_io.query_step(params)
    note = f"✓ Set up: {step.setup_words()}. Press **Run** to measure it (nothing runs by itself)"
    note += f"; the step slider then moves to step {kept}." if kept is not None else "."
    return *updates, kept, note


@dataclass
class TourPanel:
    walkthrough: gr.Walkthrough
    setups: list[tuple[TourStep, gr.Button, gr.Markdown]]


def tour_panel() -> TourPanel:
    """The stepper (ids ``tour_setup_N``, ``tour_next_N``, ``tour_note_N``, N from 1)."""
    steps, setups = load_tour(), []
    with gr.Walkthrough(selected=1, elem_id="tour_walkthrough") as walkthrough:
        for number, step in enumerate(steps, start=1):
            with gr.Step(step.title, id=number):
                gr.Markdown(step.markdown())
                with gr.Row():
                    button = gr.Button("Set this up", size="sm", elem_id=f"tour_setup_{number}")
                    if number < len(steps):  # visited steps' headers lead back
                        gr.Button("Next", size="sm", elem_id=f"tour_next_{number}").click(
                            step_selector(number + 1),
                            None,
                            walkthrough,
                            queue=False,
                            api_visibility="undocumented",
                        )
                setups.append((step, button, gr.Markdown("", elem_id=f"tour_note_{number}")))
    return TourPanel(walkthrough, setups)


def wire_setups(panel: TourPanel, link_outputs: list, precision_state, link_step_state) -> None:
    """Wire each step's "Set this up" to ``set_up``."""
    for step, button, note in panel.setups:
        outputs = [*link_outputs, link_step_state, note]
        button.click(
            lambda precision, step=step: set_up(step, precision),
            precision_state,
            outputs,
            show_progress="hidden",
            api_visibility="undocumented",
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
    return lambda: gr.Walkthrough(selected=number)
