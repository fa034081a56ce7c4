"""Starting the page: ``app.py``'s command line (``parse_args``), the model load, and the server.

The model loads before the page is served, so a bad model or device stops the start with one
line. By default the engines run in an engine process that holds the only copy of the model and
the page's model is a ``shared_model.PageModel`` of it (``cpu_split.engine_process_wanted``).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import gradio as gr
import torch

from engine.host_servers import server_choice, server_set
from engine.model.allowlist import check_model_allowed, offered_models
from engine.page.host import quiet_queue, server_priority, share, zerogpu
from engine.page.inputs import link_query
from engine.page.panels import page_panels, results_panel, server_panels, settings_panel
from engine.page.run import cpu_split, shared_model
from engine.page.views import tables
from engine.serving.run_control import RunStopped
from engine.worker import worker_main, worker_model, worker_process
from engine.worker.engine_thread import ENGINE_THREAD

ASSETS = Path(__file__).resolve().parents[3] / "assets"
PAGE_CSS = ASSETS / "page.css"
PAGE_JS = ASSETS / "page.js"


def page_assets() -> dict:
    """``launch()`` keywords for ``assets/page.css`` and ``page.js`` with its hover texts."""
    help_js = f"window.CBP_METRIC_HELP = {json.dumps(tables.METRIC_HELP)};"
    help_js += f"\nwindow.CBP_POLICY_HELP = {json.dumps(settings_panel.POLICY_HELP)};"
    help_js += f"\nwindow.CBP_LAYER_HELP = {json.dumps(results_panel.LAYER_HELP)};"
    help_js += f"\nwindow.CBP_SERVERS_HELP = {json.dumps(server_panels.SERVERS_COST)};"
    script = PAGE_JS.read_text(encoding="utf-8")
    return {"css_paths": [PAGE_CSS], "head": f"<script>{help_js}\n{script}</script>"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=page_panels.TITLE)
    parser.add_argument(
        "--model", default="embedded", help="embedded, a local folder, a .gguf file or a hub id"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, float16 or bfloat16")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--share",
        action="store_true",
        help="also print a public gradio.live link (waits a few seconds at most)",
    )
    server_choice.add_flags(parser)
    return parser.parse_args(argv)


def configured_servers(
    args: argparse.Namespace, loaded, cpus: tuple[int, ...] | None = None
) -> server_set.ServerSet | None:
    """The servers the command line and ``CBP_ENDPOINTS`` give the page (None without any);
    raises ValueError for a bad endpoint or name, or no GGUF for llama.cpp."""
    choice = server_choice.ServerChoice.from_args(args)
    found = server_choice.build(loaded, choice, lambda line: print(line, flush=True), cpus)
    return found if found.names else None


def serve(build_demo: Callable[..., gr.Blocks], argv: list[str] | None = None) -> None:
    """Load the model, then serve ``build_demo(label, server_names, precision)``'s page
    (``link_query.Precision``: the host's precisions and models); SystemExit with one line when
    the model cannot load or a server flag is wrong."""
    args = parse_args(argv)
    process, split = None, None
    try:
        nice = server_priority.server_nice()
        if cpu_split.engine_process_wanted(on_zerogpu=zerogpu.on_zerogpu()):
            check_model_allowed(args.model)  # before anything loads, as load_shared_model does
            process, split = _engine_process(args, cpu_split.cpu_split())
            model = _connect(process, split)
        else:
            model = shared_model.load_shared_model(args.model, args.device, args.dtype)
            print(f"{model.label} (loaded in {model.loaded.load_s:.1f} s)", flush=True)
        model.servers = configured_servers(args, model.loaded, split.engine if split else None)
        if model.servers is not None:  # their stages as measured on this host before
            model.queue.pace.server_ratios.update(model.servers.stage_ratios())
    except ValueError as exc:  # ModelLoadError included: one line a person can act on
        if process is not None:
            process.close()
        raise SystemExit(f"error: {exc}") from None
    if threading.current_thread() is threading.main_thread():  # where signals can be handled
        # SIGTERM (a service manager, a test) exits through ``finally``: the servers stop too,
        # and the engine process (a daemon, which also ends when the page's pipe closes)
        signal.signal(signal.SIGTERM, _exit)
    if model.servers is not None:
        model.servers.start()  # in the background: the page serves while vLLM starts
    # after the engine thread's OpenMP pool exists: the server's threads, made from this one
    # from here on, yield the CPU to a run being measured where they share its CPUs
    server_priority.lower_this_thread(server_priority.page_steps(nice, split is not None))
    try:
        _launch(build_demo, model, args)
    finally:
        if model.servers is not None:
            model.servers.close()
        if process is not None:
            process.close()


def _engine_process(
    args, split: cpu_split.CpuSplit | None
) -> tuple[worker_process.ProcessWorker, cpu_split.CpuSplit | None]:
    """The engine process on ``split``'s CPUs (made before the nice value rises), and the split."""
    jobs = ("engine.worker.comparison", "engine.worker.model_facts")  # where its jobs are
    spec = worker_process.ModelSpec(
        worker_model.load_spec, args.model, args.device, args.dtype, preload=jobs
    )
    process = worker_process.ProcessWorker(spec, cpus=split.engine if split else None)
    process.start()  # spawned before the page keeps to its CPUs: torch there sees them all
    print(f"Engine process started (pid {process.pid}); it loads the model.", flush=True)
    if split is None or not worker_main.pin_process(split.page):
        return process, None
    ENGINE_THREAD.call(torch.set_num_threads, len(split.page))
    print(f"CPUs split: {split.describe()} ({cpu_split.ENV}).", flush=True)
    return process, split


def _connect(
    process: worker_process.ProcessWorker, split: cpu_split.CpuSplit | None
) -> shared_model.PageModel:
    """The page's model from the engine process's facts (SystemExit: process or load failed)."""
    try:
        view = shared_model.PageModel.connect(process, cpu_split=split)
        _work, parts_s = view.calibrate()
    except (ValueError, RunStopped) as exc:
        process.close()
        raise SystemExit(f"error: the engine process: {exc}") from None
    shared_model.use_model(view)
    where = f"loaded in {view.facts.card.load_s:.1f} s in the engine process"
    print(f"{view.label} ({where})", flush=True)
    pace = ", ".join(f"{part} {s:.1f} s" for part, s in parts_s.items())
    print(f"Queue pace timed in the engine process: {pace}", flush=True)
    print(f"Engine process {view.facts.step}", flush=True)
    return view


def _exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def _launch(build_demo: Callable, model: shared_model.PageModel, args) -> None:
    names = model.servers.names if model.servers is not None else []
    models = offered_models(model.model_id)  # the picker's, where the allowlist names several
    dtypes = tuple(model.dtype_choices())
    picker = tuple(models) if len(models) > 1 else ()
    precision = link_query.Precision(model.dtype_name, dtypes, models[0], picker)
    demo = build_demo(model.label_markdown, names, precision)
    demo.queue()
    quiet_queue.quiet(demo)  # no thousand wake-ups a second on the engine's cores
    # quiet: Gradio's own launch lines would say "set share=True" even with --share.
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        prevent_thread_lock=True,
        quiet=True,
        **page_assets(),
    )
    print(f"* Running on local URL: {demo.local_url}", flush=True)
    if args.share:
        share.open_share_link(demo)  # bounded wait; the page serves locally meanwhile
    demo.block_thread()
