"""What a page opened from a setup link shows before its first Run: the setup's recent run, else
the recorded run said to be another setup's (its charts would read as the link's own).
"""

from __future__ import annotations

import dataclasses

import gradio as gr

from engine.page.figures.style import counted
from engine.page.handlers import playground, recording
from engine.page.inputs import link_query, page_io
from engine.page.run.run import RunRequest
from engine.page.run.run_options import RunSettings, options_from_page, prepare, settings_from_run
from engine.page.run.shared_model import PageModel, get_model
from engine.page.views import run_status
from engine.page.views.run_view import (
    RUN_OUTPUTS,
    RunState,
    run_outputs,
    slider_label,
    step_views,
)

# A link's query keys that set a run up (``step`` moves the slider of a run, and sets none up).
LINK_KEYS = ("preset", "slots", "table", *(param.url for param in link_query.PARAMS.values()))


def link_opened(request: gr.Request | None, preset_name: str | None, *values) -> tuple:
    """After ``page_io.from_link``; takes the preset, then Run's inputs; returns Run's outputs
    (``gr.skip()`` where unchanged)."""
    query, step = page_io.query_params(request), page_io.link_step(request)
    settings, previous, handle = settings_from_run(*values)
    if not _untouched(previous, handle):
        return run_outputs()
    if not any(key in query for key in LINK_KEYS):  # the recorded run's setup: at the link's step
        return _at_step(run_outputs(), previous, step, settings.x_axis)
    model = get_model()
    linked = _setup_key(model, settings)
    if linked is None:  # a Run of it would be refused, and say why: nothing to show yet
        return run_outputs()
    recent, recorded = model.recent.find(linked), recording.recorded_settings()
    if recent is not None:
        shown = playground.replayed_outputs(recent, model.recent.age_s(recent), settings.x_axis)
        shown = _at_step(shown, recent.state, step, settings.x_axis)
    elif _setup_key(model, _without_servers(settings)) != _setup_key(model, recorded):
        shown = run_outputs(status_markdown=not_linked_status(previous, preset_name, settings))
    else:  # the recorded run is the linked setup's own
        shown = _at_step(run_outputs(), previous, step, settings.x_axis)
    return shown if _untouched(previous, handle) else run_outputs()  # Run pressed meanwhile


def _at_step(outputs: tuple, state: RunState, step: int | None, x_axis: str) -> tuple:
    """``outputs`` at the link's ``step`` (clamped; unchanged if None)."""
    if step is None:
        return outputs
    step = min(max(step, 0), max(state.num_steps - 1, 0))
    values = dict(zip(RUN_OUTPUTS, outputs, strict=True))
    values |= step_views(state, step, x_axis).by_output()
    values["step_slider"] = gr.Slider(
        minimum=0, maximum=max(state.num_steps - 1, 1), value=step, label=slider_label(state)
    )
    return tuple(values.values())


def _without_servers(settings: RunSettings) -> RunSettings:
    """``settings`` without the host's servers (the recorded run has none)."""
    return dataclasses.replace(settings, server_names=None)


def _differences(settings: RunSettings) -> list[str]:
    """The settings that differ from the recorded run's, in words ("token budget 64")."""
    try:
        linked = options_from_page(_without_servers(settings))
        own = options_from_page(recording.recorded_settings())
    except ValueError:
        return []
    skip = {"servers", "dtype", "check_reference"}  # not the setup of our engines' run
    if linked.model in (None, recording.MODEL):  # the recorded run's model, named or not
        skip.add("model")
    return [
        _setting_words(field.name.replace("_", " "), getattr(linked, field.name))
        for field in dataclasses.fields(linked)
        if field.name not in skip and getattr(linked, field.name) != getattr(own, field.name)
    ]


def _setting_words(name: str, value) -> str:
    if isinstance(value, bool):
        return name if value else f"no {name}"
    return f"{name} {value}"


def _untouched(previous, handle) -> bool:
    """The page still shows its recorded run and no Run of the session waits or goes."""
    return getattr(previous, "recorded", None) is not None and (handle is None or handle.idle)


def not_linked_status(previous, preset_name: str | None, settings: RunSettings) -> str:
    """The status line over the recorded run when a link set up another setup."""
    recorded = previous.recorded
    linked = f"“{preset_name}”" if preset_name else "the requests above"
    slots = int(settings.num_slots or 0)
    linked += f" at {counted(slots, 'slot')}" if slots else ""
    differences = _differences(settings)
    linked += f" with {', '.join(differences)}" if differences else ""
    head = (
        f"**Not the linked setup:** the results below are the recorded run of "
        f"“{recorded.preset}” at {counted(recorded.num_slots, 'slot')} "
        f"({recorded.device_label}, {recorded.date}), not of {linked}. "
        f"Press Run to measure {linked} here."
    )
    unlabelled = dataclasses.replace(previous, recorded=None)  # its own label says "press Run"
    return f"{head}  \n{run_status.status_line(unlabelled)}"


def _setup_key(model: PageModel, settings: RunSettings) -> tuple | None:
    """``setup_key`` of Run with ``settings``; None if Run would refuse it or run another model."""
    if (settings.dtype or "auto").strip().lower() not in ("auto", model.dtype_name):
        return None
    if (settings.model or "").strip() not in ("", model.model_id):
        return None
    try:
        options = options_from_page(settings)
        requests, config = prepare(model, settings.rows, settings.num_slots, options)
    except ValueError:
        return None
    return RunRequest(model, requests, config, options).setup_key()
