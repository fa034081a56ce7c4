"""Presets: ready-made workloads from assets/presets.json, each with a paragraph on what it shows.

A preset is ``{"slug": str, "chat_template": bool, "slots": int, "description": str, "check": {...},
"requests": [[prompt, cap], ...]}``, where a request may add its ``arrival_s`` and then its
sampling settings (the table's columns); instead of ``requests`` a preset may name a shipped
workload file, ``"workload": "workloads/NAME.jsonl"`` (under ``assets/``), so the page and the
bench run the same requests. The slug names it in links (``?preset=seed&slots=3``), ``slots`` is
the slot count its description speaks of, and ``check`` states the description's claim in
numbers (``tests/page/inputs/test_presets_real.py`` checks it on the embedded model).

The claim holds for the engine settings the description names and the page's defaults for the
rest, so choosing a preset also sets every engine setting that changes a run's schedule
(``ENGINE_DEFAULTS``): to the preset's own ``"settings": {name: value}``, else back to the default
(a token budget left from the last preset would break this one's claim without a word). The
precision, the checks and the servers stay as the user set them: they change what is compared,
not the schedule.
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
    """Presets by name: ``{"chat_template": bool, "requests": [[prompt, cap], ...]}``."""
    return json.loads(path.read_text(encoding="utf-8"))


def apply_preset(name: str) -> tuple[list[list], bool, str]:
    """The table rows (``engine.workloads.workload.TABLE_COLUMNS``: prompt, cap, arrival_s and the
    four sampling settings), chat-template setting and explanation.

    A request without an arrival time arrives at t = 0; one without sampling settings is greedy
    (its four cells empty).
    """
    preset = load_presets()[name]
    if "workload" in preset:
        rows = table_rows(load_jsonl(ASSETS / preset["workload"]), sampling_columns=True)
    else:
        rows = [table_row(row) for row in preset["requests"]]
    return rows, bool(preset["chat_template"]), preset.get("description", "")


def choose_preset(name: str) -> tuple:
    """What choosing preset ``name`` sets, in ``CHOSEN`` order: ``apply_preset``'s rows, chat
    template and text, the slot count its text speaks of (its ``slots``) and its engine settings
    (``preset_settings``)."""
    rows, chat_template, text = apply_preset(name)
    return rows, chat_template, text, preset_slots(name), *preset_settings(name).values()


def preset_settings(name: str) -> dict:
    """The engine settings preset ``name`` runs with, in ``ENGINE_DEFAULTS`` order: its own
    ``settings`` where it names them, the defaults for the rest.

    Raises:
        ValueError: the preset names a setting that is not in ``ENGINE_DEFAULTS``.
    """
    own = load_presets()[name].get("settings", {})
    unknown = sorted(set(own) - set(ENGINE_DEFAULTS))
    if unknown:
        raise ValueError(f"preset {name!r} names unknown engine settings: {', '.join(unknown)}")
    return ENGINE_DEFAULTS | own


def preset_slots(name: str) -> int:
    """The slots a preset is meant for (its text names them); 3 if it names none."""
    return int(load_presets()[name].get("slots", 3))


def table_row(values: list) -> list:
    """A preset's request ``[prompt, cap, arrival_s?, sampling...?]`` as a full table row:
    arrival 0 and empty (greedy) sampling cells where it has none."""
    width = len(TABLE_COLUMNS)
    row = list(values)[:width]
    if len(row) < 3:
        row.append(0)
    return row + [None] * (width - len(row))


EDITED_TEXT = "Your own requests: edited from a preset, whose explanation no longer applies."


def table_edited() -> tuple[None, str]:
    """The page's answer to a user's edit of the request table: no preset is selected any more,
    and the preset's explanation gives way to ``EDITED_TEXT`` (it would describe other requests).
    """
    return None, EDITED_TEXT


def by_slug(slug: str) -> str | None:
    """The preset name for a link's ``preset=`` value (a slug or the name itself, in any letter
    case: ``SEED`` finds ``seed``), else None. An exact match wins over a case-folded one."""
    if not slug:
        return None
    shipped = load_presets()
    for match in (lambda text: text, str.casefold):
        wanted = match(slug)
        for name, preset in shipped.items():
            if wanted in (match(preset.get("slug") or ""), match(name)):
                return name
    return None
