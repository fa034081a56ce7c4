"""A knob's component on the page, built from its declaration (``engine.knobs``)."""

from __future__ import annotations

import gradio as gr

from engine.knobs import Knob

WIDGETS = {
    "checkbox": gr.Checkbox,
    "number": gr.Number,
    "slider": gr.Slider,
    "dropdown": gr.Dropdown,
    "radio": gr.Radio,
}


def knob_component(knob: Knob, **given):
    """The knob's component; ``given`` overrides any of its settings (the host's dtypes, say)."""
    widget = knob.page_widget
    shown = {"value": knob.default, "label": knob.label, "info": knob.info or None}
    if knob.labels:
        shown["choices"] = list(knob.labels)
    if widget == "slider":
        shown |= {"minimum": knob.low, "maximum": knob.high, "step": 1, "info": None}
    return WIDGETS[widget](elem_id=knob.elem_id, **shown | given)
