"""A workshop room against one page: many sessions press Run within a minute, each timed.

``python -m tools.room_load [--sessions 30] [--within-s 60] [--custom 6] [--browsers 0]
[--servers NAMES] [--url URL] [--idle-check] [--idle-repeat N] [--json F]``

Starts ``app.py`` on a free 127.0.0.1 port, offline (``tools.app_server``), unless ``--url``
names a page already serving. ``sessions`` ``gradio_client`` sessions (``tools.room``),
and ``--browsers`` more in headless Chromium, each choose a tour preset as a person would and
press Run at their own moment within ``within_s`` seconds (seeded); the last ``custom`` of them
first change one cap, so that theirs is a setup nobody ran and must be measured live; with
``--servers`` each ticks those of the host's servers, as the page's box would. The clients
stand in for people on other machines: they take only what the page leaves (``as_remote``). It
prints a line per session and a summary (``summary``), and with ``--idle-check`` runs each
measured setup again alone to compare the engines' times (the room must not slow a measurement).
docs/bench.md describes the flags and the summary's fields.
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

from engine.host_servers.server_set import LLAMACPP_NAMES, LOCAL_VLLM
from tools import app_server
from tools.room.browsers import CHROMIUM, run_browsers
from tools.room.session import (
    ESTIMATE_TOLERANCE,
    REPLAY_TARGET_S,
    TOUR,
    Session,
    as_remote,
    clients_cpus,
    preset_links,
    preset_names,
    run_session,
    run_session_live,
)

# The servers app.py starts beside the page, by the page's names, and the flag that starts each
LOCAL_SERVERS = {LOCAL_VLLM: "--vllm"} | dict.fromkeys(LLAMACPP_NAMES, "--llamacpp")

__all__ = ["CHROMIUM", "REPLAY_TARGET_S", "Session", "app_flags", "main", "run_room", "summary"]


def run_room(
    url: str,
    sessions: int,
    within_s: float,
    custom: int,
    seed: int,
    presets=TOUR,
    browsers=0,
    cpus: set[int] | None = None,
    servers: tuple[str, ...] = (),
) -> list[Session]:
    """Every session in its own thread, each pressing Run at its moment, on ``presets`` in turn
    (the last ``custom`` with a setup of their own), then ``browsers`` browser sessions on
    ``presets`` in turn, all in one more thread (``run_browsers``); all joined. ``cpus``: the
    CPUs their threads and browsers keep to (``clients_cpus``; None: any); ``servers``: the
    host's servers every session ticks, by name."""
    rng = random.Random(seed)
    names = preset_names()
    room = [
        Session(i, presets[i % len(presets)], custom=i >= sessions - custom, servers=servers)
        for i in range(sessions)
    ]
    delays = sorted(rng.uniform(0, within_s) for _ in room)
    in_browsers = [
        Session(sessions + i, presets[i % len(presets)], False, True, servers=servers)
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
    return room + in_browsers


def summary(
    room: list[Session], idle: dict[tuple, list[tuple[float, float]]] | None = None
) -> dict:
    """What the workshop needs to know: every session got a full result, with no error; those
    shown an identical run got it within ``REPLAY_TARGET_S``; each waiting session's first
    estimate against its actual wait (within ``ESTIMATE_TOLERANCE``), counted apart for the
    sessions whose own run waited and those shown an identical run when it ended."""
    replays = [s.result_after_s for s in room if s.shown_at_once and s.result_after_s is not None]
    measured = {s.preset: s.done_s for s in room if not s.custom and not s.shown_at_once}
    after_live = [
        s.done_s - measured[s.preset]
        for s in room
        if s.shown_at_once and s.done_s is not None and measured.get(s.preset) is not None
    ]
    result = {
        "sessions": len(room),
        "browsers": sum(s.browser for s in room),
        "full_results": sum(s.done_s is not None and not s.error for s in room),
        "browser_full_results": sum(
            s.browser and s.done_s is not None and not s.error for s in room
        ),
        "errors": [f"session {s.number}: {s.error}" for s in room if s.error],
        "shown_at_once": len(replays),
        "shown_at_once_max_s": max(replays, default=None),  # from the press
        # from the end of the live run of the same setup, for those pressed before it ended
        "shown_after_its_run_max_s": max(after_live, default=None),
        "replay_target_s": REPLAY_TARGET_S,
        "live": sum(not s.shown_at_once and s.done_s is not None for s in room),
        "last_result_s": max((s.done_s for s in room if s.done_s is not None), default=None),
    }
    # "": sessions whose own run waited (a custom setup, or the first of a setup); "shown_":
    # those that waited for an identical run ahead and were shown it when it ended
    told = [(s.shown_at_once, s.estimate_error) for s in room if s.estimate_error is not None]
    for prefix, shown in (("", False), ("shown_", True)):
        errors = [error for at_once, error in told if at_once == shown]
        within = sum(abs(error) <= ESTIMATE_TOLERANCE for error in errors)
        result[f"{prefix}estimates_told"] = len(errors)
        result[f"{prefix}estimates_within_30pct"] = within
        result[f"{prefix}estimate_error_median"] = statistics.median(errors) if errors else None
    if idle:
        result["room_over_idle"] = _room_over_idle(room, idle)
    return result


def _room_over_idle(room: list[Session], idle: dict) -> dict:
    """Per measured setup: the engines' times in the room over the idle page's (the median of its
    idle runs), and with two idle runs or more, how far those runs were apart (the slowest over
    the fastest): the machine's own noise, against which a room's effect can be read."""
    ratios = {}
    for s in room:
        if s.setup in idle and s.static_s and not s.shown_at_once:
            runs = idle[s.setup]
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
    its ``Session.setup`` -> ``[(static_s, continuous_s), ...]``."""
    names, idle = preset_names(), {}
    for _ in range(repeat):
        for s in room:
            if s.shown_at_once or s.error:
                continue
            again = Session(s.number, s.preset, s.custom, servers=s.servers)
            run_session_live(url, again, names)
            if again.static_s:
                idle.setdefault(s.setup, []).append((again.static_s, again.continuous_s))
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.room_load", description=__doc__)
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
    parser.add_argument(
        "--servers",
        default="",
        help="the host's servers each session ticks, comma names (e.g. vllm,llamacpp); without "
        "--url, app.py is started with the flags that serve them",
    )
    parser.add_argument("--url", help="a page already serving (default: start app.py here)")
    parser.add_argument("--idle-check", action="store_true")
    parser.add_argument(
        "--idle-repeat", type=int, default=1, help="--idle-check: alone runs per setup (default 1)"
    )
    parser.add_argument("--json", type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
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
    servers = tuple(dict.fromkeys(n.strip() for n in args.servers.split(",") if n.strip()))
    flags = app_flags(servers)
    if flags is None and args.url is None:
        parser.error(f"--servers: app.py here serves only {', '.join(LOCAL_SERVERS)}; name others "
                     "with --url, a page that serves them")  # fmt: skip
    proc, cpus = None, None
    url = args.url
    if url is None:
        log = Path(tempfile.mkdtemp(prefix="cbp-room-")) / "app.log"
        proc, url = app_server.start_app(log, flags)
        cpus = clients_cpus(proc.pid)
        kept = "" if cpus is None else f"; clients on CPUs {sorted(cpus)}, the page's"
        print(f"app.py serving at {url} (log: {log}){kept}", file=sys.stderr)
    try:
        room = run_room(
            url, args.sessions, args.within_s, args.custom, args.seed, presets, args.browsers, cpus,
            servers,
        )  # fmt: skip
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


def app_flags(servers: tuple[str, ...]) -> tuple[str, ...] | None:
    """The flags that have ``app.py`` serve ``servers`` (the page's names); None if a name is
    none of ``LOCAL_SERVERS`` (an endpoint: the page at ``--url`` must be serving it)."""
    if not set(servers) <= set(LOCAL_SERVERS):
        return None
    return tuple(dict.fromkeys(LOCAL_SERVERS[name] for name in servers))


def _session_dict(session: Session) -> dict:
    data = asdict(session)
    data.pop("statuses")
    return data | {
        "result_after_s": session.result_after_s,
        "estimate_error": session.estimate_error,
    }


if __name__ == "__main__":
    raise SystemExit(main())
