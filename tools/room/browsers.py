"""Browser sessions of a workshop room (``room_load --browsers N``).

People who use the page itself rather than its API: each opens a tour preset's link
(``?preset=SLUG&slots=N``, the link the tour hands out) in its own browser context, waits until
the preset's table is in, and presses Run at its moment in the room. What it is told is read
from the page as a person reads it: the status line and the note under Run, every ``POLL_S``.
One Chromium (Debian's, driven by Playwright's sync API, imported only when browsers are asked
for) serves every browser session from one thread: a few cost one browser process, not one each.
"""

from __future__ import annotations

import time

from tools.room.session import Session, read_status, take_times

CHROMIUM = "/usr/bin/chromium"  # the browser sessions' (--browsers)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu"]
POLL_S = 0.5  # how often each open page's status is read
LOAD_TIMEOUT_MS = 60_000  # the page and its preset's table, on a busy machine
TIMEOUT_S = 1800.0  # a browser session with no result after this long is an error
FINISHED = ("✓ Finished", "Shown at once")  # the note under Run once a result is in
REFUSED = ("Not run", "Stopped")  # the note under Run when a run did not happen or ended early


def run_browsers(
    room: list[Session], delays_s: list[float], t0: float, links: dict[str, tuple[str, str]]
) -> None:
    """Each browser session of ``room`` opens ``links[session.preset]`` (``preset_links``: the
    link, and its first prompt's start) and presses Run, once the table shows it, at
    ``t0 + delays_s[i]`` (``time.monotonic``); its page is read into it until its result is in.

    A session's failure (the page does not load, a refusal, no result in ``TIMEOUT_S``) is set as
    its ``error``; a missing Chromium or playwright package fails every session the same way.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        for session in room:
            session.error = f"ImportError: {exc} (the playwright package is needed for browsers)"
        return
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # noqa: BLE001  (no browser: each session's result, reported)
            for session in room:
                session.error = f"{type(exc).__name__}: {exc}"
            return
        try:
            _drive(browser, links, room, delays_s, t0)
        finally:
            browser.close()


def _drive(browser, links: dict, room: list[Session], delays_s: list[float], t0: float) -> None:
    """Open and press each session's page at its moment; poll the open ones until all are done."""
    pending = sorted(zip(delays_s, room, strict=True), key=lambda pair: pair[0])
    open_pages: dict[int, tuple] = {}  # session number -> (session, page)
    while pending or open_pages:
        now_s = time.monotonic() - t0
        while pending and pending[0][0] <= now_s:
            _, session = pending.pop(0)
            page = _press_run(browser, *links[session.preset], session, t0)
            if page is not None:
                open_pages[session.number] = (session, page)
        for number, (session, page) in list(open_pages.items()):
            if _poll(session, page, t0):
                page.context.close()
                del open_pages[number]
        time.sleep(POLL_S)


def _press_run(browser, link: str, first_prompt: str, session: Session, t0: float):
    """A new context on ``link``, its preset's table loaded (``first_prompt`` in its first cell:
    the page opens on its default preset, then applies the link's), the session's servers
    ticked, Run pressed; the page, or
    None after setting the session's error."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        page = context.new_page()
        page.goto(link)
        cell = page.locator('#requests_table [data-testid="cell-0-0"]', has_text=first_prompt)
        cell.wait_for(timeout=LOAD_TIMEOUT_MS)
        for name in session.servers:  # "Also run on the host's servers", as a person ticks it
            page.locator("#servers_checkbox").get_by_label(name, exact=True).check()
        session.pressed_s = time.monotonic() - t0
        page.locator("#run_button").click()
        return page
    except Exception as exc:  # noqa: BLE001  (a page that fails is the session's result)
        session.error = f"{type(exc).__name__}: {exc}"
        context.close()
        return None


def _poll(session: Session, page, t0: float) -> bool:
    """Read the page's status line into ``session``; True once the session is over."""
    now_s = time.monotonic() - t0
    try:
        note = page.locator("#run_note_markdown").inner_text().strip()
        status = page.locator("#status_markdown [data-testid=markdown]").inner_text().strip()
    except Exception as exc:  # noqa: BLE001
        session.error = f"{type(exc).__name__}: {exc}"
        return True
    if now_s - session.pressed_s > TIMEOUT_S:
        session.error = f"no result within {TIMEOUT_S:.0f} s; the page says: {note[:120]!r}"
        return True
    if note.startswith(REFUSED):
        session.error = f"the page says: {note[:200]!r}"
        return True
    read_status(session, status, now_s)
    if not note.startswith(FINISHED):
        return False
    session.done_s = now_s
    take_times(session)
    return True
