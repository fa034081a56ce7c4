"""The recorded run: a real run of the default preset, shipped so the page never opens empty.

``assets/recorded_run.json`` (traces in ``engine.trace_codec``'s compact form, the reference, and
where and when it was made); ``make record`` re-records it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine import trace_codec

if TYPE_CHECKING:
    from engine.page.run.run_options import RunSettings

RECORDING_PATH = Path(__file__).resolve().parents[3] / "assets" / "recorded_run.json"
MODEL = "embedded"  # the allowlist's name of the model ``record`` runs
FORMAT = 1


@dataclass(frozen=True)
class Recording:
    preset: str
    num_slots: int
    kv_mode: str
    model: str
    device_label: str  # "CPU · float32", as the page's model line says it
    machine: str  # e.g. "2-core AMD EPYC 7B13"
    date: str  # ISO date
    load_average: float | None = None  # the machine's 1-minute load average while recording
    num_cpus: int | None = None
    engine_threads: int | None = None  # the engines' torch threads, when fewer than num_cpus

    def label(self) -> str:
        """One Markdown sentence for the status line (it says so when the machine was busy)."""
        busy = ""
        if self.load_average and self.num_cpus and self.load_average > self.num_cpus:
            busy = (
                f", on a busy machine (load average {self.load_average:.0f} on {self.num_cpus} "
                "cores: its wall times are slow, its step counts are not)"
            )
        machine = self.machine
        if self.engine_threads:  # as the page's engines run: on CPUs of their own
            machine += f", engines on {self.engine_threads} of {self.num_cpus or '?'} CPUs"
        return (
            f"**Recorded run** of “{self.preset}” at {self.num_slots} slots on {self.device_label}"
            f" ({machine}, {self.model}), {self.date}{busy}: press Run to measure it here."
        )


def load_recording(path: Path = RECORDING_PATH):
    """The shipped run, its ``recorded`` naming where it was made (ValueError: unreadable)."""
    from engine.page.views.run_view import RunState  # run_view imports figures: not at import time

    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise ValueError(f"{path.name}: not a recorded run of format {FORMAT}.")
    meta = Recording(**data["recording"])
    reference = data.get("reference")
    return RunState(
        static=trace_codec.decode(data["static"]),
        continuous=trace_codec.decode(data["continuous"]),
        reference=None if reference is None else {int(k): v for k, v in reference.items()},
        recorded=meta,
    )


def opening_result(path: Path = RECORDING_PATH, model_id: str = MODEL):
    """What the page on the model ``model_id`` shows before its first Run: the recording, or
    None where none ships or the model is another (the page then opens empty)."""
    from engine.page.views.run_view import render

    if not path.exists() or not is_recorded_model(model_id):
        return None
    return render(load_recording(path), downloads=False)


def is_recorded_model(model_id: str | None) -> bool:
    return (model_id or MODEL).strip().lower() == MODEL


def opening_status(model_id: str | None) -> str | None:
    """The empty first view's status line on a model the recording is not of; None on its own
    model (the panel's own words)."""
    if is_recorded_model(model_id):
        return None
    return (
        "Press Run to measure both engines on this model (the recorded run is of the embedded "
        "model only)."
    )


def recorded_settings() -> RunSettings:
    """The recorded run's ``RunSettings``: the default preset and settings, on the loaded model."""
    from engine.page.inputs import link_query, page_io, presets
    from engine.page.run.run_options import RunSettings

    preset = presets.DEFAULT_PRESET
    own = {"dtype": None, "model": None}
    settings = link_query.page_defaults(preset, link_query.Precision()) | own
    rows = presets.apply_preset(preset)[0]
    return RunSettings(rows=rows, num_slots=page_io.DEFAULT_SLOTS, **settings)
