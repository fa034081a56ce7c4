"""The knob declarations agree with themselves and with what is built from them: one name, one
link parameter and one bench flag each, defaults inside their ranges, and ``EngineConfig`` fields
that exist and take the defaults."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig
from engine.knobs import KINDS, KNOB, KNOBS, PLACES, WIDGETS


def _unique(values: list[str]) -> list[str]:
    return sorted({v for v in values if values.count(v) > 1})


def test_names_parameters_and_flags_are_each_used_once():
    """No two knobs share a name, a link parameter or a bench flag."""
    for what in ("name", "url", "bench_flag"):
        values = [getattr(knob, what) for knob in KNOBS if getattr(knob, what)]
        assert not _unique(values), f"knobs share a {what}: {_unique(values)}"
    assert set(KNOB) == {knob.name for knob in KNOBS}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda knob: knob.name)
def test_each_knob_is_whole(knob):
    """Each knob has a known kind, a label, a default of its kind inside its range, page labels
    for exactly its choices, and help for its bench flag."""
    assert knob.kind in KINDS, f"{knob.name}: unknown kind {knob.kind!r}"
    assert knob.label and knob.named, f"{knob.name}: no label"
    assert bool(knob.bench_flag) == bool(knob.bench_help), f"{knob.name}: a flag without help"
    if knob.kind == "flag":
        assert isinstance(knob.default, bool), f"{knob.name}: default {knob.default!r}"
    elif knob.kind == "choice":
        assert knob.default is None or knob.default in knob.choices, f"{knob.name}: default"
        if knob.labels:
            assert sorted(v for _, v in knob.labels) == sorted(knob.choices), knob.name
    else:
        high = knob.high if knob.high is not None else knob.default
        in_range = knob.low <= knob.default <= high
        assert in_range or (knob.zero and knob.default == 0), f"{knob.name}: default out of range"
    assert not knob.hovers or len(knob.hovers) == len(knob.labels), f"{knob.name}: hovers"


def test_engine_config_fields_exist_and_take_the_defaults():
    """Each knob's ``config`` names an ``EngineConfig`` field, and the knobs' defaults (as a run
    reads them) make a good config."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    given = {knob.config: knob.unset for knob in KNOBS if knob.config}
    assert set(given) <= fields, f"no such EngineConfig field: {set(given) - fields}"
    assert EngineConfig(**given).problems() == []


def test_page_hints_are_known_and_element_ids_and_preset_places_unique():
    """Each knob's widget and place are known ones, no two knobs share an element id, and the
    preset places run 1, 2, 3, ... (``/apply_preset``'s order) without a gap or a repeat."""
    for knob in KNOBS:
        assert knob.page_widget in WIDGETS, f"{knob.name}: widget {knob.page_widget!r}"
        assert knob.place in PLACES, f"{knob.name}: place {knob.place!r}"
    elem_ids = [knob.elem_id for knob in KNOBS]
    assert not _unique(elem_ids), f"knobs share an element id: {_unique(elem_ids)}"
    places = sorted(knob.preset for knob in KNOBS if knob.preset)
    assert places == list(range(1, len(places) + 1)), f"preset places {places}"
