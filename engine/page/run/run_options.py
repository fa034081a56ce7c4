"""The page's knobs: what Run reads, by name; parsed; then the table validated and tokenized.

Bad values raise one ``ValueError`` naming them all (Gradio hands numbers over as strings too).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.knob_values import flag as _flag
from engine.knob_values import knob_value
from engine.knob_values import whole_number as _whole_number
from engine.knobs import KNOB, KNOBS, Knob
from engine.serving.run_control import run_time_limit_s
from engine.workloads.workload import (
    check_arrivals,
    parse_table,
    poisson_arrivals,
    raise_problems,
    tokenize_requests,
)

MAX_ARRIVAL_S = 300.0  # the latest arrival a page run waits for (and never past its time limit)

# Run's inputs that are no knob, at their places in the /run API (a contract: clients call /run by
# position); the knobs (``engine.knobs.KNOBS``, in their order) take the places between and after.
# Each is one of ``OTHER_INPUTS`` or of the session's states (``RUN_STATES``).
OTHER_PLACES = {"rows": 0, "previous": 10, "handle": 14, "server_names": 15, "replay_recent": 18}


def _run_inputs() -> tuple[str, ...]:
    """Run's inputs in the /run API's order: ``OTHER_PLACES`` at theirs, the knobs around them."""
    knobs, inputs = [knob.name for knob in KNOBS], []
    at = {place: name for name, place in OTHER_PLACES.items()}
    while knobs or len(inputs) in at:
        inputs.append(at[len(inputs)] if len(inputs) in at else knobs.pop(0))
    return tuple(inputs)


# The Run event's inputs, in the /run API's order: each a ``RunSettings`` field or one of the
# session's states. ``engine.page.panels.page_panels`` finds each one's component by this name.
RUN_INPUTS = _run_inputs()
RUN_STATES = ("previous", "handle")  # the session's, not settings: not in the /run API
# Run's inputs that are no knob of ``engine.knobs.KNOBS``: the request table (a list of rows, or a
# pandas DataFrame), the host's servers to run too (names: a list, or one name), and whether a
# run of the same setup measured on this host within the replay window may be shown instead of
# queueing a new one (``engine.page.run.recent_runs``; the page's Run button sends True).
OTHER_INPUTS = ("rows", "server_names", "replay_recent")
REQUIRED = RUN_INPUTS[: RUN_INPUTS.index("previous")]  # what /run took at first: no default


def _input_default(name: str):
    """A Run input's /run default: none for the first ten, else None (off for an on/off input)."""
    if name in REQUIRED:
        return inspect.Parameter.empty
    on_off = name == "replay_recent" or (name in KNOB and KNOB[name].kind == "flag")
    return False if on_off else None


RunSettings = dataclasses.make_dataclass(
    "RunSettings",
    [
        (name, Any)
        if name in REQUIRED
        else (name, Any, dataclasses.field(default=_input_default(name)))
        for name in RUN_INPUTS
        if name not in RUN_STATES
    ],
    frozen=True,
)
RunSettings.__module__ = __name__
RunSettings.__doc__ = """What Run reads from the page, one field per ``RUN_INPUTS`` name less the
states, as Gradio hands it over (numbers may be strings, blanks None or ""): each knob's field is
named after it (``engine.knobs``), the others are ``OTHER_INPUTS``. ``options_from_page`` parses
it. The fields without a default are the /run API's required inputs; the defaults are the API's
too (blank: the page's default)."""
# The Run handler's parameters, one per ``RUN_INPUTS`` name: Gradio names /run's after them.
RUN_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_input_default(n))
        for n in RUN_INPUTS
    ]
)


def settings_from_run(*values, **named) -> tuple[RunSettings, Any, Any]:
    """The Run event's inputs, by position or name, as ``(settings, previous, handle)``; raises
    TypeError for too many, an unknown or a missing required one."""
    bound = RUN_SIGNATURE.bind(*values, **named)
    bound.apply_defaults()
    given = dict(bound.arguments)
    previous, handle = given.pop("previous"), given.pop("handle")
    return RunSettings(**given), previous, handle


# A knob's option type, by its kind (a zero knob's also None: not set).
OPTION_TYPES = {"flag": bool, "choice": str | None, "whole": int, "number": float}
OPTION_NAMES = {"arrival_rate": "arrival_rate_per_s"}  # a knob whose option has a unit in its name
# The knobs ``options_from_page`` parses: every knob but the slots (``engine_config`` checks
# them) and the x axis (a view: ``view_inputs``).
OPTION_KNOBS = tuple(knob for knob in KNOBS if knob.name not in ("num_slots", "x_axis"))


def _option_field(knob: Knob) -> tuple:
    kind = OPTION_TYPES[knob.kind] | None if knob.zero else OPTION_TYPES[knob.kind]
    return OPTION_NAMES.get(knob.name, knob.name), kind, dataclasses.field(default=knob.unset)


RunOptions = dataclasses.make_dataclass(
    "RunOptions",
    [_option_field(knob) for knob in OPTION_KNOBS]
    + [
        ("arrival_seed", int, dataclasses.field(default=0)),
        # host-configured servers to run too, by name (never a URL)
        ("servers", tuple[str, ...], dataclasses.field(default=())),
    ],
    frozen=True,
)
RunOptions.__module__ = __name__
RunOptions.__doc__ = """The page's engine knobs, beside the table and the slot count: one field per
``OPTION_KNOBS`` knob as a run reads it (``knob_value``), named after it (``OPTION_NAMES`` where
not) and defaulting to its ``unset`` (None for a blank budget, rate, KV budget, dtype or model:
no limit, the table's arrival_s, room for every slot, the model's own, app.py's --model); then
the Poisson arrivals' seed and the host's servers to run too."""


def options_from_page(settings: RunSettings) -> RunOptions:
    """The page's knobs as ``RunOptions``; raises ValueError naming every bad setting at once."""
    problems = []
    values = {}
    for knob in OPTION_KNOBS:  # a bad one told, and standing at its default
        value = _told(problems, knob_value, knob, getattr(settings, knob.name))
        values[OPTION_NAMES.get(knob.name, knob.name)] = knob.unset if value is None else value
    servers = _told(problems, _names, settings.server_names) or ()
    options = RunOptions(**values, servers=servers)
    _told(problems, view_inputs, settings)  # no engine knobs, but Run's inputs: named with the rest
    if problems:  # the knobs that parsed are checked too (a bad one stands at its default)
        _told(problems, engine_config, settings.num_slots, options)
    raise_problems(problems, "bad settings")
    return options


def view_inputs(settings: RunSettings) -> tuple[str, bool]:
    """The x axis (blank: "time") and ``replay_recent``; ValueError if either is bad."""
    problems, axis = [], KNOB["x_axis"]
    x_axis = knob_value(axis, settings.x_axis)  # blank: its default
    if x_axis not in axis.choices:
        problems.append(f"The x axis must be one of {', '.join(axis.choices)} (got {x_axis!r}).")
    replay = _told(problems, _flag, settings.replay_recent, "replay_recent")
    raise_problems(problems, "bad settings")
    return x_axis, replay


def engine_config(num_slots, options: RunOptions) -> EngineConfig:
    """The continuous engine's config; raises ValueError naming every bad setting at once."""
    problems, slots_knob = [], KNOB["num_slots"]
    slots = _told(problems, _whole_number, num_slots, slots_knob.named)
    if slots is not None and slots > slots_knob.high:  # EngineConfig: at least 1
        problems.append(f"Slots must be at most {slots_knob.high} (got {slots}).")
        slots = None
    given = {k.config: getattr(options, k.name) for k in OPTION_KNOBS if k.config}
    try:
        config = EngineConfig(num_slots=1 if slots is None else slots, **given)  # a bad count told
    except ValueError as exc:
        problems.append(str(exc))
    raise_problems(problems, "bad settings")
    return config


def _told(problems: list[str], parse: Callable, *args):
    """``parse(*args)``, or None with its ``ValueError``'s message added to ``problems``."""
    try:
        return parse(*args)
    except ValueError as exc:
        problems.append(str(exc))
        return None


def prepare(model, rows, num_slots, options: RunOptions):
    """Validate and tokenize the table, and build the continuous engine's config.

    Raises:
        ValueError: a bad table, knob or mix of them, or a KV budget too small for a request.
    """
    config = engine_config(num_slots, options)
    if options.batch_invariant:
        model.check_batch_invariant()
    specs = parse_table(request_rows(rows))
    if options.arrival_rate_per_s:
        specs = poisson_arrivals(specs, options.arrival_rate_per_s, options.arrival_seed)
    time_limit_s = run_time_limit_s()
    check_arrivals(specs, min(MAX_ARRIVAL_S, time_limit_s or MAX_ARRIVAL_S))
    requests = tokenize_requests(
        specs,
        model.loaded.tokenizer,
        chat_template=options.chat_template,
        max_context=model.loaded.max_context,
    )
    model.check_kv_budget(config, requests)  # before any engine starts
    if options.servers:  # only names the host configured; the page never takes an address
        if getattr(model, "servers", None) is None:
            raise ValueError("This page has no servers configured, so none can run.")
        model.servers.check_names(options.servers)
    return requests, config


TABLE_FORM = '{"headers": [...], "data": [[prompt, max_new_tokens, ...], ...]}'


def request_rows(table) -> list:
    """The table's rows from ``TABLE_FORM``, a list or a DataFrame; else ValueError."""
    if hasattr(table, "values") and hasattr(table, "columns"):  # a pandas DataFrame
        return table.values.tolist()
    rows = table.get("data") if isinstance(table, dict) else table
    if not isinstance(rows, list | tuple):
        raise ValueError(f"The request table must be a table, {TABLE_FORM} (got {_quoted(table)}).")
    problems = [
        f"Row {i} must be a list of cells (got {_quoted(row)})."
        for i, row in enumerate(rows, start=1)
        if not isinstance(row, list | tuple)
    ]
    raise_problems(problems, "bad rows")
    return list(rows)


def _quoted(value, max_chars: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def _names(value) -> tuple[str, ...]:
    """The chosen server names (a list, or one name); ValueError for anything else."""
    if value is None or value == "":
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"Servers must be a list of server names (got {_quoted(value)}).")
    return tuple(names)
