"""The Run settings: one named object for what Run reads, declared once in the /run API's order,
found on the page by name, and parsed into the same ``RunOptions`` as before (no model needed)."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import gradio as gr
import pytest

from engine.config import EngineConfig
from engine.knobs import KNOB
from engine.page.handlers import playground, recording
from engine.page.inputs import page_io
from engine.page.run import run_options
from engine.page.run.run_options import (
    RUN_INPUTS,
    RUN_STATES,
    RunOptions,
    RunSettings,
    options_from_page,
    settings_from_run,
)

# The /run API's parameters, by position: a contract (API clients call /run by position).
API_PARAMETERS = [
    "rows",
    "num_slots",
    "chat_template",
    "check_reference",
    "kv_mode",
    "token_budget",
    "policy",
    "compare_hf",
    "arrival_rate",
    "x_axis",
    "kv_budget_mib",
    "block_size",
    "prefix_caching",
    "server_names",
    "dtype",
    "batch_invariant",
    "replay_recent",  # appended later, default False: API clients run live unless they ask
    "model",  # appended later, default None: the model app.py started with
]
# Each Run input's component on the page, by element id (None: a ``gr.State``).
ELEM_IDS = {
    "rows": "requests_table",
    "num_slots": "slots_slider",
    "chat_template": "chat_checkbox",
    "check_reference": "reference_checkbox",
    "kv_mode": "kv_mode_dropdown",
    "token_budget": "token_budget_number",
    "policy": "policy_radio",
    "compare_hf": "compare_hf_checkbox",
    "arrival_rate": "arrival_rate_number",
    "x_axis": "x_axis_radio",
    "previous": None,
    "kv_budget_mib": "kv_budget_number",
    "block_size": "block_size_number",
    "prefix_caching": "prefix_caching_checkbox",
    "handle": None,
    "server_names": "servers_checkbox",
    "dtype": "dtype_dropdown",
    "batch_invariant": "batch_invariant_checkbox",
    "replay_recent": "replay_checkbox",  # hidden; the page sets it on load
    "model": "model_dropdown",  # hidden where the host has one model
}
ROWS = [["hello", 4]]
# A Run as the page sends it: numbers as numbers or strings, the states, a server's name.
PAGE_VALUES = (ROWS, "3", 1, True, "paged", "8", "prefill_first", False, "2.5", "step", "prev")
PAGE_VALUES += ("12", "4", True, "handle", ["gpu"], " bfloat16 ", True, True, " /m/tiny ")


@pytest.fixture(scope="module")
def demo() -> gr.Blocks:
    import app

    return app.build_demo("Model: test")


def _run_fn(demo: gr.Blocks):
    return next(fn for fn in demo.fns.values() if fn.api_name == "run")


def test_run_inputs_are_the_settings_fields_and_the_two_states():
    """Each of Run's inputs is named once, and the names are RunSettings' fields and its states."""
    fields = [f.name for f in dataclasses.fields(RunSettings)]
    assert len(set(RUN_INPUTS)) == len(RUN_INPUTS), f"a Run input named twice: {RUN_INPUTS}"
    assert [n for n in RUN_INPUTS if n not in RUN_STATES] == fields, "declaration and fields differ"
    assert set(RUN_STATES) <= set(RUN_INPUTS)


def test_each_run_input_is_a_knob_another_input_or_a_state():
    """Run reads every declared knob, and besides them only the other inputs and the states; the
    fields after the required ones default to off or blank."""
    names = set(RUN_INPUTS) - set(RUN_STATES) - set(run_options.OTHER_INPUTS)
    assert names <= set(KNOB), f"Run inputs that are no knob: {names - set(KNOB)}"
    assert set(KNOB) - names == set(), f"knobs Run does not read: {set(KNOB) - names}"
    for field in dataclasses.fields(RunSettings)[len(run_options.REQUIRED) :]:
        assert field.default in (False, None), f"{field.name} defaults to {field.default!r}"


def test_app_wires_runs_inputs_in_the_declared_order_by_name(demo):
    """app.py's Run event reads, at each position of RUN_INPUTS, the component named for it."""
    run = _run_fn(demo)
    assert len(run.inputs) == len(RUN_INPUTS), f"{len(run.inputs)} inputs wired"
    for position, (name, component) in enumerate(zip(RUN_INPUTS, run.inputs, strict=True)):
        if ELEM_IDS[name] is None:
            assert isinstance(component, gr.State), f"input {position} ({name}) is no state"
        else:
            assert component.elem_id == ELEM_IDS[name], f"input {position} ({name}) wired wrongly"


def test_the_run_api_keeps_its_positions_names_and_defaults(demo):
    """/run's parameters keep their names and positions; the first ten are required, as before."""
    parameters = demo.get_api_info()["named_endpoints"]["/run"]["parameters"]
    assert [p["parameter_name"] for p in parameters] == API_PARAMETERS
    signature = inspect.signature(playground.run_event)
    assert list(signature.parameters) == list(RUN_INPUTS)
    defaults = {n: p.default for n, p in signature.parameters.items()}
    assert all(defaults[n] is inspect.Parameter.empty for n in RUN_INPUTS[:10]), defaults
    later = {n: defaults[n] for n in RUN_INPUTS[10:]}
    assert later == dict.fromkeys(RUN_INPUTS[10:], None) | {
        "prefix_caching": False,
        "batch_invariant": False,
        "replay_recent": False,  # an API client runs live unless it asks for a replay
    }, later


def test_page_values_become_settings_by_name_and_parse_as_before():
    """Run's values by position and by name give the same settings, which parse into the
    RunOptions the positional parser gave."""
    settings, previous, handle = settings_from_run(*PAGE_VALUES)
    named = settings_from_run(**dict(zip(RUN_INPUTS, PAGE_VALUES, strict=True)))
    assert named == (settings, previous, handle), "by name and by position differ"
    assert (previous, handle) == ("prev", "handle"), "the states went astray"
    assert (settings.rows, settings.num_slots, settings.x_axis) == (ROWS, "3", "step")
    assert options_from_page(settings) == RunOptions(
        chat_template=True,
        check_reference=True,
        kv_mode="paged",
        token_budget=8,
        policy="prefill_first",
        compare_hf=False,
        arrival_rate_per_s=2.5,
        kv_budget_mib=12.0,
        block_size=4,
        prefix_caching=True,
        servers=("gpu",),
        dtype="bfloat16",
        batch_invariant=True,
        model="/m/tiny",
    )


def test_every_bad_setting_is_named_at_once():
    """A run with several bad settings is refused with one message naming each of them: knobs
    that are no number of the right kind and settings out of range alike."""
    knobs = (False, True, "paged", "abc", "", False, "-2", "time", None, "0", 0)  # ... block size
    settings, _, _ = settings_from_run(ROWS, "3", *knobs)
    with pytest.raises(ValueError) as excinfo:
        options_from_page(settings)
    message = str(excinfo.value)
    for named in ("Token budget must be", "Arrival rate (requests/s) must be", "Block size must"):
        assert named in message, f"{named!r} not named: {message!r}"
    in_range, _, _ = settings_from_run(ROWS, "0", False, True, "paged", 2, "", False, 0, "time")
    with pytest.raises(ValueError) as excinfo:
        run_options.engine_config(
            in_range.num_slots, dataclasses.replace(options_from_page(in_range), block_size=0)
        )
    message = str(excinfo.value)
    for named in ("Slots must be", "Block size must"):
        assert named in message, f"{named!r} not named: {message!r}"
    with pytest.raises(ValueError) as excinfo:
        EngineConfig(num_slots=4, kv_mode="nope", max_num_batched_tokens=2, kv_budget_mib=-1)
    message = str(excinfo.value)
    for named in ("Unknown KV mode", "token budget (2)", "KV budget must"):
        assert named in message, f"{named!r} not named: {message!r}"


def test_an_api_call_with_the_first_ten_inputs_takes_the_defaults():
    """/run with its ten required inputs only: blank knobs parse to the page's defaults."""
    settings, previous, handle = settings_from_run(ROWS, 2, *(False, True, "", 0, ""), 0, 0, "time")
    assert (previous, handle) == (None, None)
    assert options_from_page(settings) == RunOptions(chat_template=False, check_reference=True)
    with pytest.raises(TypeError):
        settings_from_run(*PAGE_VALUES, "one too many")
    with pytest.raises(TypeError):
        settings_from_run(ROWS, 2)


def test_the_recorded_run_uses_the_pages_default_settings(demo):
    """The recorded run's settings parse as the page's initial values do (its dtype and model:
    the loaded model's), and into the options it was recorded with."""
    recorded = recording.recorded_settings()
    values = {n: c.value for n, c in zip(RUN_INPUTS, _run_fn(demo).inputs, strict=True)}
    shown = {f.name: values[f.name] for f in dataclasses.fields(RunSettings)}
    page = RunSettings(**shown | {"rows": recorded.rows, "dtype": None, "model": None})
    assert options_from_page(recorded) == options_from_page(page), "not the page's defaults"
    assert recorded.num_slots == page.num_slots and recorded.x_axis == page.x_axis
    before = RunOptions(chat_template=recorded.chat_template, check_reference=True, kv_mode="paged")
    assert options_from_page(recorded) == before


def test_a_link_sets_settings_by_their_field_names(demo):
    """A link's knobs are RunSettings fields, app.py writes them to those fields' components,
    and from_link hands each value to its name."""
    fields = {f.name for f in dataclasses.fields(RunSettings)}
    knobs = set(page_io.LINK_OUTPUTS) - {"preset", "preset_text", "input_warning"}
    assert knobs <= fields, f"link outputs that are no setting: {knobs - fields}"
    (load,) = [fn for fn in demo.fns.values() if fn.fn is page_io.from_link]
    ids = [c.elem_id for c in load.outputs]
    by_name = dict(zip(page_io.LINK_OUTPUTS, ids, strict=True))
    assert all(by_name[k] == ELEM_IDS[k] for k in knobs), by_name
    assert by_name["preset"] == "preset_dropdown" and by_name["preset_text"] == "preset_markdown"
    link = page_io.from_link(SimpleNamespace(query_params={"slots": "5", "prefix_caching": "1"}))
    got = dict(zip(page_io.LINK_OUTPUTS, link, strict=True))
    assert (got["num_slots"], got["prefix_caching"]) == (5, True), got
    assert all(got[n] == gr.skip() for n in ("preset", "rows", "chat_template")), got


@pytest.mark.parametrize("zero", [0, 0.0, "0", "0.0", " 0.00 "])
def test_zero_in_any_spelling_means_no_limit(zero):
    """A knob whose 0 means "not set" reads 0 as unset however a client spells it: a number
    field sends 0.0, an API client may send "0.0"; neither is refused as a bad budget."""
    assert run_options.knob_value(KNOB["token_budget"], zero) is None
    assert run_options.knob_value(KNOB["kv_budget_mib"], zero) is None
    with pytest.raises(ValueError, match="budget"):
        run_options.knob_value(KNOB["token_budget"], "lots")
