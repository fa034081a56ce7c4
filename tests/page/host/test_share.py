"""Share links: a public link is printed, or after a bounded wait a line says there is none."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from engine.page.host import share
from tools import app_server

LOCAL_URL = "http://127.0.0.1:7860/"


def _demo():
    return SimpleNamespace(local_url=LOCAL_URL, share_url=None)


def test_link_is_printed_and_kept():
    """A tunnel that answers in time gives its URL, printed and stored on the demo."""
    lines, demo = [], _demo()
    url = share.open_share_link(demo, 2.0, lambda d: "https://abc.gradio.live", lines.append)
    assert url == "https://abc.gradio.live" and demo.share_url == url
    assert len(lines) == 1 and url in lines[0], f"printed {lines}"


def test_failed_tunnel_is_reported_with_its_reason():
    """A tunnel that fails says why and names the local URL that keeps serving."""
    lines = []

    def offline(_demo):
        raise RuntimeError("Could not get share link from Gradio API Server.\nmore detail")

    assert share.open_share_link(_demo(), 2.0, offline, lines.append) is None
    assert len(lines) == 1, f"printed {lines}"
    assert "No public link" in lines[0] and "Could not get share link" in lines[0], lines[0]
    assert LOCAL_URL in lines[0] and "more detail" not in lines[0], lines[0]


def test_hanging_tunnel_waits_only_the_bound_then_prints_a_late_link():
    """A hanging tunnel is given up after the wait; if it comes up later its link still prints."""
    lines, release = [], threading.Event()

    def slow(_demo):
        release.wait(5)
        return "https://late.gradio.live"

    start_s = time.monotonic()
    assert share.open_share_link(_demo(), 0.3, slow, lines.append) is None
    waited_s = time.monotonic() - start_s
    assert waited_s < 1.0, f"waited {waited_s:.1f} s for a 0.3 s bound"
    assert "no tunnel after 0.3 s" in lines[0], lines
    release.set()
    deadline = time.monotonic() + 5
    while len(lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines[1:] == ["* Public link, late: https://late.gradio.live"], lines


@pytest.mark.real_model
def test_app_share_offline_says_so_and_keeps_serving(tmp_path):
    """``app.py --share`` offline prints "No public link" within the bound and still serves."""
    log_path = tmp_path / "app.log"
    proc, url = app_server.start_app(log_path, ("--share",))  # RuntimeError quotes its log
    try:
        served_s = time.monotonic()
        while "No public link" not in log_path.read_text():
            waited_s = time.monotonic() - served_s
            assert waited_s < share.SHARE_WAIT_S + 5, f"no message:\n{log_path.read_text()}"
            time.sleep(0.2)
        time.sleep(0.5)
        assert proc.poll() is None, f"app.py exited:\n{log_path.read_text()[-2000:]}"
        app_server.wait_until_serving(url, proc, log_path)  # still answers after giving up
    finally:
        app_server.stop(proc)
