"""Share links: a public gradio.live link to the running page, asked for in the background
(Gradio's ``launch(share=True)`` can wait a minute before saying anything).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse, urlunparse

SHARE_WAIT_S = 8.0  # seconds to wait for the tunnel before saying there is none


def gradio_tunnel(demo: Any) -> str:
    """Open Gradio's share tunnel to ``demo``; the public URL (raises what Gradio raises)."""
    from gradio import networking

    url = networking.setup_tunnel(
        local_host=demo.server_name,
        local_port=demo.server_port,
        share_token=demo.share_token,
        share_server_address=None,
        share_server_tls_certificate=None,
    )
    return urlunparse(("https",) + urlparse(url)[1:])


def open_share_link(
    demo: Any,
    wait_s: float = SHARE_WAIT_S,
    tunnel: Callable[[Any], str] = gradio_tunnel,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> str | None:
    """Log a public link within ``wait_s`` seconds, or why there is none; never raises."""
    result: dict[str, Any] = {}
    gave_up = threading.Event()

    def attempt() -> None:
        try:
            result["url"] = tunnel(demo)
        except Exception as exc:  # noqa: BLE001  (any failure means "no link"; it is reported)
            result["error"] = exc
            return
        demo.share_url = result["url"]
        if gave_up.is_set():
            log(f"* Public link, late: {result['url']}")

    thread = threading.Thread(target=attempt, name="share-tunnel", daemon=True)
    thread.start()
    thread.join(wait_s)
    if "url" in result:
        log(f"* Public link: {result['url']}  (share it with the room; it lasts up to a week)")
        return result["url"]
    gave_up.set()
    if "error" in result:
        reason = f"the tunnel could not be made: {_first_line(result['error'])}"
    else:
        reason = f"no tunnel after {wait_s:g} s (offline?)"
    log(f"* No public link: {reason}. The page keeps serving locally at {demo.local_url}")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
