"""Presets: ready-made workloads from assets/presets.json, each with a paragraph on what it shows.
Format: docs/page.md, "The presets and tour files".
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.knobs import KNOB, KNOBS
from engine.workloads.workload import TABLE_COLUMNS, load_jsonl
from engine.workloads.workload_files import table_rows

ASSETS = Path(__file__).resolve().parents[3] / "assets"
PRESETS_PATH = ASSETS / "presets.json"
DEFAULT_PRESET = "Article's six requests"
# The engine settings a preset's claim depends on, by their page names (``page_panels.COMPONENTS``)
# with their knobs' defaults (``engine.knobs``; ``settings_panel`` shows these values at first), in
# the order the /apply_preset endpoint returns them: each knob's ``preset`` place (a contract: a
# new one takes the next).
PRESET_KNOBS = tuple(k.name for k in sorted(KNOBS, key=lambda k: k.preset) if k.preset)
ENGINE_DEFAULTS = {name: KNOB[name].default for name in PRESET_KNOBS}
# What choosing a preset sets, in ``choose_preset``'s order (``page_panels.COMPONENTS`` names).
CHOSEN = ("rows", "chat_template", "preset_text", "num_slots", *ENGINE_DEFAULTS)


def load_presets(path: Path = PRESETS_PATH) -> dict[str, dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def apply_preset(name: str) -> tuple[list[list], bool, str]:
    """The table rows, chat-template setting and text (no arrival: t = 0; no sampling: greedy)."""
    preset = load_presets()[name]
    if "workload" in preset:
        rows = table_rows(load_jsonl(ASSETS / preset["workload"]), sampling_columns=True)
    else:
        rows = [table_row(row) for row in preset["requests"]]
    return rows, bool(preset["chat_template"]), preset.get("description", "")


def choose_preset(name: str) -> tuple:
    rows, chat_template, text = apply_preset(name)
    return rows, chat_template, text, preset_slots(name), *preset_settings(name).values()


def preset_settings(name: str) -> dict:
    """The engine settings preset ``name`` runs with; ValueError for a setting not in
    ``ENGINE_DEFAULTS``."""
    own = load_presets()[name].get("settings", {})
    unknown = sorted(set(own) - set(ENGINE_DEFAULTS))
    if unknown:
        raise ValueError(f"preset {name!r} names unknown engine settings: {', '.join(unknown)}")
    return ENGINE_DEFAULTS | own


def preset_slots(name: str) -> int:
    """The slots a preset's text speaks of; 3 if it names none."""
    return int(load_presets()[name].get("slots", 3))


def table_row(values: list) -> list:
    """A preset's request ``[prompt, cap, arrival_s?, sampling...?]`` as a full table row."""
    width = len(TABLE_COLUMNS)
    row = list(values)[:width]
    if len(row) < 3:
        row.append(0)
    return row + [None] * (width - len(row))


EDITED_TEXT = "Your own requests: edited from a preset, whose explanation no longer applies."


def table_edited() -> tuple[None, str]:
    """After an edit of the table: no preset selected, and ``EDITED_TEXT`` as the explanation."""
    return None, EDITED_TEXT


def by_slug(slug: str) -> str | None:
    """The preset for a link's ``preset=`` (slug or name, any case, exact match first), or None."""
    if not slug:
        return None
    shipped = load_presets()
    for match in (lambda text: text, str.casefold):
        wanted = match(slug)
        for name, preset in shipped.items():
            if wanted in (match(preset.get("slug") or ""), match(name)):
                return name
    return None
