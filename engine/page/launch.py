"""Starting the page: ``app.py``'s command line, the model load, and the server.

``python app.py [--model embedded|PATH|HUB_ID] [--device auto] [--dtype auto] [--port 7860]
[--host 127.0.0.1] [--share]``. The model loads before the page is served, so a bad model or device
stops the start with one line instead of failing the first Run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from engine.page import panels, share, shared_model, tables

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PAGE_CSS = ASSETS / "page.css"
PAGE_JS = ASSETS / "page.js"


def page_assets() -> dict:
    """``launch()`` keywords for the page's own CSS and script (``assets/page.css``, ``page.js``),
    with the metrics columns' hover definitions handed to the script."""
    help_js = f"window.CBP_METRIC_HELP = {json.dumps(tables.METRIC_HELP)};"
    script = PAGE_JS.read_text(encoding="utf-8")
    return {"css_paths": [PAGE_CSS], "head": f"<script>{help_js}\n{script}</script>"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=panels.TITLE)
    parser.add_argument("--model", default="embedded", help="embedded, a local folder or hub id")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, float16 or bfloat16")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--share",
        action="store_true",
        help="also print a public gradio.live link (waits a few seconds at most)",
    )
    return parser.parse_args(argv)


def serve(build_demo: Callable[[str], gr.Blocks], argv: list[str] | None = None) -> None:
    """Load the model (so problems show at start), then serve ``build_demo(label)``'s page.

    Raises:
        SystemExit: the model cannot load (one line a person can act on).
    """
    args = parse_args(argv)
    try:
        shared = shared_model.load_shared_model(args.model, args.device, args.dtype)
    except ValueError as exc:  # ModelLoadError included: one line a person can act on
        raise SystemExit(f"error: {exc}") from None
    print(f"{shared.label} (loaded in {shared.loaded.load_s:.1f} s)", flush=True)
    demo = build_demo(shared.label)
    demo.queue()
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
