"""``make record``: re-record the run the page opens on (``assets/recorded_run.json``).

``python -m tools.record_run [--out PATH] [--device cpu]`` runs the default preset with the
page's default settings on the embedded model, on the CPUs and threads the page's engines have,
and writes it as ``engine.page.handlers.recording`` reads it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path

from engine import trace_codec
from engine.model import openmp_env
from engine.page.handlers.recording import (
    FORMAT,
    RECORDING_PATH,
    Recording,
    recorded_settings,
)


def _load_average() -> float | None:
    """The 1-minute load average (runnable threads), where the system tells it."""
    try:
        return round(os.getloadavg()[0], 1)
    except OSError:
        return None


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
    """Re-record the run on the CPUs and threads the page's engines have
    (``keep_to_engine_cpus``).

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

    from engine.page.run import cpu_split
    from engine.worker import engine_thread, worker_main

    wanted = cpu_split.engine_process_wanted(environ)  # a CPU host: ZeroGPU lends GPUs
    split = cpu_split.cpu_split(environ) if wanted else None
    if split is None or not worker_main.pin_process(split.engine):
        return None
    # where the model loads, and runs
    engine_thread.ENGINE_THREAD.call(torch.set_num_threads, len(split.engine))
    return split


if __name__ == "__main__":
    main()
