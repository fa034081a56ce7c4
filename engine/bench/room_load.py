"""A workshop room against one page: many sessions press Run within a minute, each timed.

``python -m engine.bench.room_load [--sessions 30] [--within-s 60] [--custom 6] [--browsers 0]
[--url URL] [--idle-check] [--idle-repeat N] [--json F]``

1. starts ``app.py`` on a free 127.0.0.1 port, offline (``engine.bench.app_server``), unless
   ``--url`` names a page already serving;
2. ``sessions`` ``gradio_client`` sessions, each at its own moment within ``within_s`` seconds
   (seeded), choose a preset of the workshop tour as a person would (``/apply_preset``) and press
   Run (``/run`` with ``replay_recent``, as the page's button sends it). ``custom`` of them first
   change one cap, so theirs is a setup nobody ran: it must be measured live, in turn. With
   ``--browsers N``, N more people use the page itself in headless Chromium: each opens a tour
   preset's link and presses Run at its moment (``run_browsers``, below). The clients and
   browsers stand in for people on other machines: they run at nice 19 (``as_remote``), and
   when the page keeps its engines on CPUs of their own, on the page's CPUs only
   (``clients_cpus``), so they take only what the page leaves and nothing from the runs;
3. reads each session's stream: when it was told its place and estimate, when its run started,
   when its result came, and whether it was shown at once (an identical run measured earlier);
4. with ``--idle-check``, runs each measured setup once more alone (``--idle-repeat N``: N times,
   and the summary says how far apart those runs were, the machine's own noise), and compares the
   engines' times in the room with the idle page's (the room must not slow a measurement);
5. prints a line per session and a summary, and writes them as JSON with ``--json``.

The summary says what the workshop needs: every session got a full result, with no error; the
sessions on an already-run setup got theirs within ``REPLAY_TARGET_S``; each waiting session's
first estimate against its actual wait (target: within ±30 %), counted apart for the sessions
whose own run waited and those shown an identical run when it ended. The page times its pace
at start (``SharedModel.calibrate_pace``), so a session that waits is told an estimate from its
first line; every estimate it tells counts.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from engine.bench import app_server
from engine.bench.room.browsers import CHROMIUM, run_browsers
from engine.bench.room.session import (
    ESTIMATE_TOLERANCE,
    REPLAY_TARGET_S,
    TOUR,
    Session,
    as_remote,
    clients_cpus,
    engine_times,
    preset_links,
    preset_names,
    run_session,
    run_session_live,
)

__all__ = ["CHROMIUM", "REPLAY_TARGET_S", "Session", "main", "run_room", "summary"]


def run_room(
    url: str,
    sessions: int,
    within_s: float,
    custom: int,
    seed: int,
    presets=TOUR,
    browsers=0,
    cpus: set[int] | None = None,
) -> list[Session]:
    """Every session in its own thread, each pressing Run at its moment, on ``presets`` in turn
    (the last ``custom`` with a setup of their own), then ``browsers`` browser sessions on
    ``presets`` in turn, all in one more thread (``run_browsers``); all joined. ``cpus``: the
    CPUs their threads and browsers keep to (``clients_cpus``; None: any)."""
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
        threads.append(threading.Thread(target=as_remote(run_browsers, cpus), args=args))
        threads[-1].start()
    for session, delay_s in zip(room, delays, strict=True):
        thread = threading.Timer(delay_s, as_remote(run_session, cpus), (url, session, t0, names))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    for session in in_browsers:
        engine_times(session)
    return room + in_browsers


def summary(
    room: list[Session], idle: dict[tuple, list[tuple[float, float]]] | None = None
) -> dict:
    """What the workshop needs to know (see the module docstring)."""
    errors = [s for s in room if s.error]
    replays = [s.result_after_s for s in room if s.shown_at_once and s.result_after_s is not None]
    measured = {s.preset: s.done_s for s in room if not s.custom and not s.shown_at_once}
    after_live = [
        s.done_s - measured[s.preset]
        for s in room
        if s.shown_at_once and s.done_s is not None and measured.get(s.preset) is not None
    ]
    live_estimates = [
        s.estimate_error for s in room if s.estimate_error is not None and not s.shown_at_once
    ]
    shown_estimates = [
        s.estimate_error for s in room if s.estimate_error is not None and s.shown_at_once
    ]
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
        # sessions whose own run waited (a custom setup, or the first of a setup)
        "estimates_told": len(live_estimates),
        "estimates_within_30pct": sum(abs(e) <= ESTIMATE_TOLERANCE for e in live_estimates),
        "estimate_error_median": statistics.median(live_estimates) if live_estimates else None,
        # sessions that waited for an identical run ahead and were shown it when it ended
        "shown_estimates_told": len(shown_estimates),
        "shown_estimates_within_30pct": sum(abs(e) <= ESTIMATE_TOLERANCE for e in shown_estimates),
        "shown_estimate_error_median": (
            statistics.median(shown_estimates) if shown_estimates else None
        ),
        "last_result_s": max((s.done_s for s in room if s.done_s is not None), default=None),
    }
    if idle:
        result["room_over_idle"] = _room_over_idle(room, idle)
    return result


def _room_over_idle(room: list[Session], idle: dict) -> dict:
    """Per measured setup: the engines' times in the room over the idle page's (the median of its
    idle runs), and with two idle runs or more, how far those runs were apart (the slowest over
    the fastest): the machine's own noise, against which a room's effect can be read."""
    ratios = {}
    for s in room:
        key = (s.preset, s.custom, s.number if s.custom else None)
        if key in idle and s.static_s and not s.shown_at_once:
            runs = idle[key]
            entry = {}
            for i, engine in enumerate(("static", "continuous")):
                times = [run[i] for run in runs]
                room_s = s.static_s if engine == "static" else s.continuous_s
                entry[engine] = room_s / statistics.median(times)
                if len(times) > 1:
                    entry[f"idle_spread_{engine}"] = max(times) / min(times)
            ratios[f"{s.preset}{' (custom)' if s.custom else ''} #{s.number}"] = entry
    return ratios


def idle_check(url: str, room: list[Session], repeat: int = 1) -> dict[tuple, list]:
    """Each setup measured live in the room, run again alone (live, no replay) ``repeat`` times:
    its key -> ``[(static_s, continuous_s), ...]``."""
    names, idle = preset_names(), {}
    for _ in range(repeat):
        for s in room:
            if s.shown_at_once or s.error:
                continue
            again = Session(s.number, s.preset, s.custom)
            run_session_live(url, again, names)
            if again.static_s:
                key = (s.preset, s.custom, s.number if s.custom else None)
                idle.setdefault(key, []).append((again.static_s, again.continuous_s))
    return idle


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
    parser.add_argument(
        "--idle-repeat", type=int, default=1, help="--idle-check: alone runs per setup (default 1)"
    )
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
    proc, cpus = None, None
    url = args.url
    if url is None:
        log = Path(tempfile.mkdtemp(prefix="cbp-room-")) / "app.log"
        proc, url = app_server.start_app(log)
        cpus = clients_cpus(proc.pid)
        kept = "" if cpus is None else f"; clients on CPUs {sorted(cpus)}, the page's"
        print(f"app.py serving at {url} (log: {log}){kept}", file=sys.stderr)
    try:
        room = run_room(
            url, args.sessions, args.within_s, args.custom, args.seed, presets, args.browsers, cpus
        )
        idle = idle_check(url, room, max(1, args.idle_repeat)) if args.idle_check else None
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
