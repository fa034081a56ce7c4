"""The recorded run: a real run of the default preset, shipped so the page never opens empty.

Before anyone presses Run, the page shows ``assets/recorded_run.json``: both engines' traces and
the ``model.generate`` reference, recorded by the real engines on the embedded model with the
page's default settings, and labelled with where and when (device, dtype, date). Every chart,
table and the step slider read it like any run (``engine.page.views.run_view``).

Each trace is in the trace codec's compact form (``engine.trace_codec``).

Re-record it with ``python -m engine.page.handlers.recording`` (``make record``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine import trace_codec
from engine.model import openmp_env

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


def opening_result(path: Path = RECORDING_PATH):
    """What the page shows before its first Run: the recording rendered (no download files), or
    None when no recording ships (the page then opens empty)."""
    from engine.page.views.run_view import render

    if not path.exists():
        return None
    return render(load_recording(path), downloads=False)


def _load_average() -> float | None:
    """The 1-minute load average (runnable threads), where the system tells it."""
    try:
        return round(os.getloadavg()[0], 1)
    except OSError:
        return None


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


def record(path: Path = RECORDING_PATH, device: str | None = None) -> Path:
    """Run the default preset with the page's default settings on the embedded model and write
    the recording to ``path``. Slow: it runs both engines and the reference for real."""
    from engine.page.handlers import playground
    from engine.page.inputs import presets
    from engine.page.run import shared_model
    from engine.page.run.run_options import options_from_page, prepare

    model = shared_model.load_shared_model(device=device)
    load_before = _load_average()
    settings = recorded_settings()
    options = options_from_page(settings)
    requests, config = prepare(model, settings.rows, settings.num_slots, options)
    # On the page's engine thread (the model's worker), where the model was loaded: one OpenMP
    # pool, as in the page.
    state = playground.run_engines(model, requests, config, options)
    meta = Recording(
        preset=presets.DEFAULT_PRESET,
        num_slots=config.num_slots,
        kv_mode=config.kv_mode,
        model=model.loaded.name,
        device_label=model.loaded.device_label,
        machine=_machine(model.loaded),
        date=datetime.date.today().isoformat(),
        load_average=None if load_before is None else (load_before + _load_average()) / 2,
        num_cpus=os.cpu_count(),
        engine_threads=_engine_threads(model),
    )
    data = {
        "format": FORMAT,
        "recording": meta.__dict__,
        "static": trace_codec.encode(state.static, compact=True),
        "continuous": trace_codec.encode(state.continuous, compact=True),
        "reference": state.reference,
    }
    path.write_text(json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n", "utf-8")
    return path


def _machine(loaded) -> str:
    """The CPU's core count and model name, or the GPU's label."""
    from engine.model.device import cpu_model  # torch: not before main's openmp_env.configure

    if loaded.device.type != "cpu":
        return loaded.device_label
    return f"{os.cpu_count()}-core {cpu_model() or platform.machine()}"


def _engine_threads(model) -> int | None:
    """The engines' torch threads, when the recording kept to fewer CPUs than the machine has
    (``keep_to_engine_cpus``); None otherwise, or on a GPU."""
    import torch

    from engine.worker.engine_thread import ENGINE_THREAD

    if model.loaded.device.type != "cpu":
        return None
    threads = ENGINE_THREAD.call(torch.get_num_threads)
    return threads if threads < (os.cpu_count() or threads) else None


def main(argv: list[str] | None = None) -> None:
    """``python -m engine.page.handlers.recording [--out PATH] [--device cpu]``: re-record the
    run, on the CPUs and threads the page's engines have (``keep_to_engine_cpus``).

    Raises:
        SystemExit: ``CBP_ENGINE_PROCESS`` or ``CBP_ENGINE_CPUS`` is set to a value they refuse.
    """
    parser = argparse.ArgumentParser(description="Re-record the page's shipped run.")
    parser.add_argument("--out", type=Path, default=RECORDING_PATH)
    parser.add_argument("--device", default="cpu", help="cpu (what the label says), cuda, mps")
    args = parser.parse_args(argv)
    openmp_env.configure()  # as app.py does: the engines run in worker threads, as in the page
    try:
        split = keep_to_engine_cpus() if args.device == "cpu" else None
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if split is not None:
        print(f"Recording where the page's engines run: {split.describe()}.", flush=True)
    written = record(args.out, args.device)
    print(f"wrote {written} ({written.stat().st_size / 1024:.0f} KiB)")


def keep_to_engine_cpus(environ: Mapping[str, str] | None = None):
    """Keep this process to the CPUs the page's engines get, with a torch thread each, as the
    engine process does (``cpu_split``, ``engine.worker.worker_main.worker_main``); the split,
    or None where the page would not split (``CBP_ENGINE_PROCESS=off``, ``CBP_ENGINE_CPUS=all``,
    one CPU). So the recorded run is timed as the page's runs are, and the references it stores
    are keyed (by torch thread count, among others) where the engine process looks them up.

    Raises:
        ValueError: ``CBP_ENGINE_PROCESS`` or ``CBP_ENGINE_CPUS`` has a value they refuse.
    """
    import torch

    from engine.page.run import cpu_split, engine_worker
    from engine.worker import engine_thread, worker_main

    wanted = engine_worker.engine_process_wanted(environ)  # a CPU host: ZeroGPU lends GPUs
    split = cpu_split.cpu_split(environ) if wanted else None
    if split is None or not worker_main.pin_process(split.engine):
        return None
    # where the model loads, and runs
    engine_thread.ENGINE_THREAD.call(torch.set_num_threads, len(split.engine))
    return split


if __name__ == "__main__":
    main()
