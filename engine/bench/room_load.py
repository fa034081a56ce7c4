"""A workshop room against one page: many sessions press Run within a minute, each timed.

``python -m engine.bench.room_load [--sessions 30] [--within-s 60] [--custom 6] [--browsers 0]
[--url URL] [--idle-check] [--json F]``

1. starts ``app.py`` on a free 127.0.0.1 port, offline (``engine.bench.app_server``), unless
   ``--url`` names a page already serving;
2. ``sessions`` ``gradio_client`` sessions, each at its own moment within ``within_s`` seconds
   (seeded), choose a preset of the workshop tour as a person would (``/apply_preset``) and press
   Run (``/run`` with ``replay_recent``, as the page's button sends it). ``custom`` of them first
   change one cap, so theirs is a setup nobody ran: it must be measured live, in turn. With
   ``--browsers N``, N more people use the page itself in headless Chromium: each opens a tour
   preset's link and presses Run at its moment (``run_browsers``, below);
3. reads each session's stream: when it was told its place and estimate, when its run started,
   when its result came, and whether it was shown at once (an identical run measured earlier);
4. with ``--idle-check``, runs each measured setup once more alone, and compares the engines'
   times in the room with the idle page's (the room must not slow a measurement);
5. prints a line per session and a summary, and writes them as JSON with ``--json``.

The summary says what the workshop needs: every session got a full result, with no error; the
sessions on an already-run setup got theirs within ``REPLAY_TARGET_S``; each waiting session's
first estimate against its actual wait (target: within ±30 %). The page has no estimate until
the first run on this host has done a few steps; every estimate it tells counts.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.bench import app_server

TOUR = ("seed", "one-long-many-short", "equal-caps", "long-prompts", "arrivals",
        "shared-system-prompt")  # fmt: skip
PRESETS_PATH = Path(__file__).resolve().parents[2] / "assets" / "presets.json"
STATUS_INDEX = 7  # the status line's place in /run's outputs (the run's state is not sent)
REPLAY_TARGET_S = 10.0
ESTIMATE_TOLERANCE = 0.30
MIN_WAIT_S = 10.0  # an estimate's error is judged against at least this wait
ROUNDING_S = 5.0  # the page says a wait under 90 s to the nearest 10 s
STATUS_TIMES = re.compile(r"static ([0-9.]+) s · continuous ([0-9.]+) s")
ESTIMATE = re.compile(r"estimate ([0-9.]+) (s|min)")
CHROMIUM = "/usr/bin/chromium"  # the browser sessions' (--browsers)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu"]
POLL_S = 0.5  # how often each open page's status is read
LOAD_TIMEOUT_MS = 60_000  # the page and its preset's table, on a busy machine
TIMEOUT_S = 1800.0  # a browser session with no result after this long is an error
FINISHED = ("✓ Finished", "Shown at once")  # the note under Run once a result is in
REFUSED = ("Not run", "Stopped")  # the note under Run when a run did not happen or ended early


@dataclass
class Session:
    """One person's Run, as the room saw it; times in seconds since the room started."""

    number: int
    preset: str
    custom: bool
    browser: bool = False  # a real browser on the page (else a gradio_client session)
    pressed_s: float = 0.0
    first_estimate_s: float | None = None  # the first estimate it was told
    estimate_told_s: float | None = None  # when it was told that estimate
    started_s: float | None = None  # its run began (the status said Running)
    done_s: float | None = None
    shown_at_once: bool = False
    static_s: float | None = None  # the engines' own times, from the final status line
    continuous_s: float | None = None
    error: str | None = None
    statuses: list[str] = field(default_factory=list, repr=False)

    @property
    def result_after_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.pressed_s

    @property
    def estimate_error(self) -> float | None:
        """(estimate - actual wait) / actual wait, for a session told an estimate; a wait under
        ``MIN_WAIT_S`` counts as that long (nobody can tell a 2 s wait from a 5 s one), and an
        estimate under 90 s covers the 10 s the page rounds it to ("0 s" is 0 to 5 s)."""
        if self.first_estimate_s is None or self.started_s is None:
            return None
        actual_s = self.started_s - self.estimate_told_s
        off_s = self.first_estimate_s - actual_s
        if self.first_estimate_s < 90:
            off_s = math.copysign(max(0.0, abs(off_s) - ROUNDING_S), off_s)
        return off_s / max(actual_s, MIN_WAIT_S)


def preset_names(path: Path = PRESETS_PATH) -> dict[str, str]:
    """The page's preset names by slug (``assets/presets.json``)."""
    presets = json.loads(path.read_text(encoding="utf-8"))
    return {preset["slug"]: name for name, preset in presets.items()}


def preset_links(url: str, path: Path = PRESETS_PATH) -> dict[str, tuple[str, str]]:
    """The tour's link to each preset by slug, with the slots its text names (3 if none), and
    the start of its first prompt (which the page's table shows once the link is applied)."""
    links = {}
    for preset in json.loads(path.read_text(encoding="utf-8")).values():
        if "requests" in preset:
            first = preset["requests"][0][0]
        else:  # a workload file under assets/: its first line's prompt
            with (path.parent / preset["workload"]).open(encoding="utf-8") as lines:
                first = json.loads(lines.readline())["prompt"]
        link = preset_link(url, preset["slug"], int(preset.get("slots", 3)))
        links[preset["slug"]] = (link, first.split("\n")[0][:30])
    return links


def _value(output):
    """A component's value as ``gradio_client`` hands it (a dict with ``value``, or plain)."""
    return output.get("value", output) if isinstance(output, dict) else output


def _setup(url: str, session: Session, names: dict[str, str]):
    """A client that chose the session's preset as a person would (``/apply_preset``), and the
    /run inputs it would send: the table (one cap changed for a custom session), slots, knobs."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    chosen = client.predict(names[session.preset], api_name="/apply_preset")
    table, chat, _text, slots = chosen[:4]  # then the engine settings, all defaults in the tour
    table = _value(table)
    if session.custom:  # one cap changed: a setup nobody ran
        table["data"][0][1] = int(table["data"][0][1]) + 1 + session.number
    # chat template, reference check, KV mode, token budget, policy, transformers, rate, x axis
    knobs = (chat, True, "paged", 0, "decode_first", False, 0, "time")
    return client, (table, _value(slots), *knobs)


def run_session(url: str, session: Session, t0: float, names: dict[str, str]) -> None:
    """Choose the session's preset, press Run, and read its stream into ``session``."""
    try:
        client, inputs = _setup(url, session, names)
        session.pressed_s = time.monotonic() - t0
        job = client.submit(*inputs, replay_recent=True, api_name="/run")
        for update in job:
            _read(session, str(_value(update[STATUS_INDEX])), time.monotonic() - t0)
        final = job.outputs()[-1] if job.outputs() else None
        if final is None:
            raise RuntimeError("no result")
        _read(session, str(_value(final[STATUS_INDEX])), time.monotonic() - t0)
        session.done_s = time.monotonic() - t0
        found = STATUS_TIMES.search(session.statuses[-1])
        if found is None:
            raise RuntimeError(f"no engine times in the final status: {session.statuses[-1]!r}")
        session.static_s, session.continuous_s = float(found[1]), float(found[2])
    except Exception as exc:  # noqa: BLE001  (any failure is the session's result, reported)
        session.error = f"{type(exc).__name__}: {exc}"


def _read(session: Session, status: str, now_s: float) -> None:
    """Note what one status line says: streamed Markdown, or the text a browser shows."""
    if session.statuses and session.statuses[-1] == status:
        return
    session.statuses.append(status)
    status = status.replace("**", "")
    if status.startswith("Waiting for the model:"):
        found = ESTIMATE.search(status)
        if found and session.first_estimate_s is None:
            scale = 60.0 if found[2] == "min" else 1.0
            session.first_estimate_s = float(found[1]) * scale
            session.estimate_told_s = now_s
    elif status.startswith("Running") and session.started_s is None:
        session.started_s = now_s
    elif status.startswith("Shown at once:"):
        session.shown_at_once = True


def run_room(
    url: str, sessions: int, within_s: float, custom: int, seed: int, presets=TOUR, browsers=0
) -> list[Session]:
    """Every session in its own thread, each pressing Run at its moment, on ``presets`` in turn
    (the last ``custom`` with a setup of their own), then ``browsers`` browser sessions on
    ``presets`` in turn, all in one more thread (``run_browsers``); all joined."""
    rng = random.Random(seed)
    names = preset_names()
    room = [
        Session(i, presets[i % len(presets)], custom=i >= sessions - custom)
        for i in range(sessions)
    ]
    delays = sorted(rng.uniform(0, within_s) for _ in room)
    in_browsers = [
        Session(sessions + i, presets[i % len(presets)], custom=False, browser=True)
        for i in range(browsers)
    ]
    browser_delays = [rng.uniform(0, within_s) for _ in in_browsers]
    t0 = time.monotonic()
    threads = []
    if in_browsers:
        args = (in_browsers, browser_delays, t0, preset_links(url))
        threads.append(threading.Thread(target=run_browsers, args=args))
        threads[-1].start()
    for session, delay_s in zip(room, delays, strict=True):
        thread = threading.Timer(delay_s, run_session, (url, session, t0, names))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    for session in in_browsers:
        _engine_times(session)
    return room + in_browsers


def _engine_times(session: Session) -> None:
    """The engines' times from a finished browser session's last status (an error if none)."""
    if session.error or session.done_s is None:
        return
    found = STATUS_TIMES.search(session.statuses[-1]) if session.statuses else None
    if found is None:
        last = session.statuses[-1][:120] if session.statuses else ""
        session.error = f"no engine times in the final status: {last!r}"
        return
    session.static_s, session.continuous_s = float(found[1]), float(found[2])


def summary(room: list[Session], idle: dict[tuple, tuple[float, float]] | None = None) -> dict:
    """What the workshop needs to know (see the module docstring)."""
    errors = [s for s in room if s.error]
    replays = [s.result_after_s for s in room if s.shown_at_once and s.result_after_s is not None]
    measured = {s.preset: s.done_s for s in room if not s.custom and not s.shown_at_once}
    after_live = [
        s.done_s - measured[s.preset]
        for s in room
        if s.shown_at_once and s.done_s is not None and measured.get(s.preset) is not None
    ]
    estimates = [s.estimate_error for s in room if s.estimate_error is not None]
    result = {
        "sessions": len(room),
        "browsers": sum(s.browser for s in room),
        "full_results": sum(s.done_s is not None and not s.error for s in room),
        "browser_full_results": sum(
            s.browser and s.done_s is not None and not s.error for s in room
        ),
        "errors": [f"session {s.number}: {s.error}" for s in errors],
        "shown_at_once": len(replays),
        "shown_at_once_max_s": max(replays, default=None),  # from the press
        # from the end of the live run of the same setup, for those pressed before it ended
        "shown_after_its_run_max_s": max(after_live, default=None),
        "replay_target_s": REPLAY_TARGET_S,
        "live": sum(not s.shown_at_once and s.done_s is not None for s in room),
        "estimates_told": len(estimates),
        "estimates_within_30pct": sum(abs(e) <= ESTIMATE_TOLERANCE for e in estimates),
        "estimate_error_median": statistics.median(estimates) if estimates else None,
        "last_result_s": max((s.done_s for s in room if s.done_s is not None), default=None),
    }
    if idle:
        result["room_over_idle"] = _room_over_idle(room, idle)
    return result


def _room_over_idle(room: list[Session], idle: dict) -> dict:
    """Per measured setup: the engines' times in the room over the idle page's."""
    ratios = {}
    for s in room:
        key = (s.preset, s.custom, s.number if s.custom else None)
        if key in idle and s.static_s and not s.shown_at_once:
            idle_static, idle_continuous = idle[key]
            ratios[f"{s.preset}{' (custom)' if s.custom else ''} #{s.number}"] = {
                "static": s.static_s / idle_static,
                "continuous": s.continuous_s / idle_continuous,
            }
    return ratios


def idle_check(url: str, room: list[Session]) -> dict[tuple, tuple[float, float]]:
    """Each setup measured live in the room, run again alone (live, no replay)."""
    names, idle = preset_names(), {}
    for s in room:
        if s.shown_at_once or s.error:
            continue
        again = Session(s.number, s.preset, s.custom)
        run_session_live(url, again, names)
        if again.static_s:
            idle[(s.preset, s.custom, s.number if s.custom else None)] = (
                again.static_s,
                again.continuous_s,
            )
    return idle


def run_session_live(url: str, session: Session, names: dict[str, str]) -> None:
    """``run_session`` with ``replay_recent`` off: a fresh measurement, its result awaited."""
    client, inputs = _setup(url, session, names)
    result = client.predict(*inputs, replay_recent=False, api_name="/run")
    found = STATUS_TIMES.search(str(_value(result[STATUS_INDEX])))
    if found:
        session.static_s, session.continuous_s = float(found[1]), float(found[2])


def print_report(room: list[Session], result: dict) -> None:
    print(f"{'#':>3} {'preset':<22} {'kind':<10} {'pressed':>8} {'estimate':>9} {'waited':>7} "
          f"{'result':>7}  engines (static / continuous)")  # fmt: skip
    for s in room:
        kind = "shown" if s.shown_at_once else ("custom" if s.custom else "live")
        kind += " (b)" if s.browser else ""
        est = "—" if s.first_estimate_s is None else f"{s.first_estimate_s:.0f} s"
        waited = "—" if s.started_s is None else f"{s.started_s - s.pressed_s:.0f} s"
        after = "—" if s.result_after_s is None else f"{s.result_after_s:.0f} s"
        engines = "" if s.static_s is None else f"{s.static_s:.2f} / {s.continuous_s:.2f} s"
        line = f"{s.number:>3} {s.preset:<22} {kind:<10} {s.pressed_s:>7.0f}s {est:>9} "
        print(
            line + f"{waited:>7} {after:>7}  {engines}" + (f"  ERROR {s.error}" if s.error else "")
        )
    print(json.dumps(result, indent=2))


# --- browser sessions (--browsers) --------------------------------------------------------------
# People who use the page itself rather than its API: each opens a tour preset's link
# (``?preset=SLUG&slots=N``, the link the tour hands out) in its own browser context, waits until
# the preset's table is in, and presses Run at its moment in the room. What it is told is read
# from the page as a person reads it: the status line and the note under Run, every ``POLL_S``.
# One Chromium (Debian's, driven by Playwright's sync API, imported only when browsers are asked
# for) serves every browser session from one thread: a few cost one browser process, not one each.


def preset_link(url: str, slug: str, num_slots: int) -> str:
    """The tour's link to preset ``slug`` with its slot count, on the page at ``url``."""
    return f"{url.rstrip('/')}/?preset={slug}&slots={num_slots}"


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
    the page opens on its default preset, then applies the link's), Run pressed; the page, or
    None after setting the session's error."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    try:
        page = context.new_page()
        page.goto(link)
        cell = page.locator('#requests_table [data-testid="cell-0-0"]', has_text=first_prompt)
        cell.wait_for(timeout=LOAD_TIMEOUT_MS)
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
    if not note.startswith(FINISHED):
        _read(session, status, now_s)
        return False
    _read(session, status, now_s)
    session.done_s = now_s
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.room_load", description=__doc__)
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--within-s", type=float, default=60.0)
    parser.add_argument("--custom", type=int, default=6, help="sessions with a setup of their own")
    parser.add_argument(
        "--browsers",
        type=int,
        default=0,
        help="headless Chromium sessions more, each pressing Run on a tour preset's link "
        "(needs /usr/bin/chromium and the playwright package)",
    )
    parser.add_argument("--seed", type=int, default=0, help="when each session presses Run")
    parser.add_argument(
        "--presets", default=",".join(TOUR), help="preset slugs, in turn (default: the tour's)"
    )
    parser.add_argument("--url", help="a page already serving (default: start app.py here)")
    parser.add_argument("--idle-check", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 0 <= args.custom <= args.sessions or args.sessions < 1 or args.browsers < 0:
        parser.error(
            "--sessions must be at least 1, --custom between 0 and --sessions, "
            "--browsers at least 0"
        )
    presets = tuple(p.strip() for p in args.presets.split(",") if p.strip())
    unknown = set(presets) - set(preset_names())
    if unknown or not presets:
        parser.error(f"--presets: no such preset {sorted(unknown)}; see assets/presets.json")
    proc = None
    url = args.url
    if url is None:
        log = Path(tempfile.mkdtemp(prefix="cbp-room-")) / "app.log"
        proc, url = app_server.start_app(log)
        print(f"app.py serving at {url} (log: {log})", file=sys.stderr)
    try:
        room = run_room(
            url, args.sessions, args.within_s, args.custom, args.seed, presets, args.browsers
        )
        idle = idle_check(url, room) if args.idle_check else None
    finally:
        if proc is not None:
            app_server.stop(proc)
    result = summary(room, idle)
    print_report(room, result)
    if args.json:
        doc = {"summary": result, "sessions": [_session_dict(s) for s in room]}
        args.json.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return 0 if not result["errors"] and result["full_results"] == len(room) else 1


def _session_dict(session: Session) -> dict:
    data = asdict(session)
    data.pop("statuses")
    return data | {
        "result_after_s": session.result_after_s,
        "estimate_error": session.estimate_error,
    }


if __name__ == "__main__":
    raise SystemExit(main())
