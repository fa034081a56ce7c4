"""The recorded run: a real run of the default preset, shipped so the page never opens empty.

Before anyone presses Run, the page shows ``assets/recorded_run.json``: both engines' traces and
the ``model.generate`` reference, recorded by the real engines on the embedded model with the
page's default settings, and labelled with where and when (device, dtype, date). Every chart,
table and the step slider read it like any run (``engine.page.views.run_view``).

Each trace is in the trace codec's compact form (``engine.trace_codec``). ``make record``
re-records it (``tools/record_run.py``).
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
    """Where, when and how the shipped run was recorded."""

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
    """The shipped run as a ``run_view.RunState`` whose ``recorded`` names where it was made.

    Raises:
        ValueError: the file is not a recording this page can read.
    """
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
    """What the page on the model ``model_id`` (the allowlist's name) shows before its first
    Run: the recording rendered (no download files), or None when no recording ships or the
    page's model is not the recorded one (the page then opens empty, ``opening_status`` on its
    status line)."""
    from engine.page.views.run_view import render

    if not path.exists() or not is_recorded_model(model_id):
        return None
    return render(load_recording(path), downloads=False)


def is_recorded_model(model_id: str | None) -> bool:
    """Whether ``model_id`` names the model the recording was made on."""
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
    """The recorded run's ``RunSettings``: the default preset with the page's default settings
    (``link_query.page_defaults``), on the loaded model in its precision (no ``model``, no
    ``dtype``)."""
    from engine.page.inputs import link_query, page_io, presets
    from engine.page.run.run_options import RunSettings

    preset = presets.DEFAULT_PRESET
    own = {"dtype": None, "model": None}
    settings = link_query.page_defaults(preset, link_query.Precision()) | own
    rows = presets.apply_preset(preset)[0]
    return RunSettings(rows=rows, num_slots=page_io.DEFAULT_SLOTS, **settings)
