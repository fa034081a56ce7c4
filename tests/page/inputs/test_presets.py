"""Choosing a preset sets what its claim depends on: the table, the slots and the engine settings.

A token budget (or any engine setting) left from the last preset would break the next preset's
claim without a word, so choosing a preset sets every engine setting back to the page's default
unless the preset names its own.
"""

from __future__ import annotations

import pytest

from engine.page.inputs import presets


def _chosen(name: str) -> dict:
    return dict(zip(presets.CHOSEN, presets.choose_preset(name), strict=True))


def test_choosing_any_preset_sets_every_engine_setting_to_its_default():
    """Every shipped preset, chosen, sets its rows, template, text and slots, and each engine
    setting that changes the schedule back to the page's default (none names its own)."""
    for name, preset in presets.load_presets().items():
        chosen = _chosen(name)
        rows, chat_template, text = presets.apply_preset(name)
        assert (chosen["rows"], chosen["chat_template"], chosen["preset_text"]) == (
            rows,
            chat_template,
            text,
        ), name
        assert chosen["num_slots"] == preset["slots"], name
        engine = {key: chosen[key] for key in presets.ENGINE_DEFAULTS}
        assert engine == presets.ENGINE_DEFAULTS, f"{name} leaves engine settings as they were"


def test_a_preset_that_names_an_engine_setting_sets_it(monkeypatch):
    """A preset's own ``settings`` are set when it is chosen, the rest go back to the defaults;
    a setting that is not an engine setting is refused with the preset's name."""
    shipped = presets.load_presets()
    name = presets.DEFAULT_PRESET
    shipped[name]["settings"] = {"token_budget": 64, "prefix_caching": True}
    shipped["Odd"] = dict(shipped[name], settings={"dtype": "bfloat16"})
    monkeypatch.setattr(presets, "load_presets", lambda path=None: shipped)
    chosen = _chosen(name)
    assert (chosen["token_budget"], chosen["prefix_caching"]) == (64, True)
    assert chosen["kv_mode"] == "paged" and chosen["arrival_rate"] == 0
    with pytest.raises(ValueError, match="'Odd' names unknown engine settings: dtype"):
        presets.choose_preset("Odd")


def test_apply_preset_returns_the_engine_settings_in_its_order():
    """/apply_preset's outputs after the table, chat template, text and slots: the engine
    settings in the order clients read them by position (a contract: a new one goes last)."""
    assert presets.PRESET_KNOBS == (
        "kv_mode",
        "kv_budget_mib",
        "block_size",
        "prefix_caching",
        "token_budget",
        "policy",
        "arrival_rate",
    )
    assert presets.CHOSEN[:4] == ("rows", "chat_template", "preset_text", "num_slots")
