"""One session of a workshop room: a person's Run through the page's API, as the room saw it.

``run_session`` plays a ``gradio_client`` session: it chooses a tour preset as a person would
(``/apply_preset``), presses Run (``/run`` with ``replay_recent``, as the page's button sends it)
and reads the stream into a ``Session``; ``read_status`` reads one status line, streamed or as a
browser shows it (``tools.room.browsers``).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.knobs import KNOB
from engine.page.run.run_options import REQUIRED

TOUR = ("seed", "one-long-many-short", "equal-caps", "long-prompts", "arrivals",
        "shared-system-prompt")  # fmt: skip
PRESETS_PATH = Path(__file__).resolve().parents[2] / "assets" / "presets.json"
STATUS_INDEX = 7  # the status line's place in /run's outputs (the run's state is not sent)
# /run's required knobs after the table and the slots, in its order (the page's ``RUN_INPUTS``)
RUN_KNOBS = tuple(name for name in REQUIRED if name in KNOB and name != "num_slots")
REPLAY_TARGET_S = 10.0
ESTIMATE_TOLERANCE = 0.30
MIN_WAIT_S = 10.0  # an estimate's error is judged against at least this wait
ROUNDING_S = 5.0  # the page says a wait under 90 s to the nearest 10 s
STATUS_TIMES = re.compile(r"static ([0-9.]+) s · continuous ([0-9.]+) s")
ESTIMATE = re.compile(r"estimate (?:([0-9.]+) (s|min)|a few seconds)")  # the latter: 0 to 5 s
# The room's clients stand in for people on other machines: on the page's own CPUs they run at
# the lowest priority, so that they take only what the page leaves (``as_remote``).
CLIENT_NICE = 19
# How often a session reads its stream (gradio_client's own iterator polls every 1 ms).
POLL_S = 0.25


@dataclass
class Session:
    """One person's Run, as the room saw it; times in seconds since the room started."""

    number: int
    preset: str
    custom: bool
    browser: bool = False  # a real browser on the page (else a gradio_client session)
    servers: tuple[str, ...] = ()  # the host's servers it ticks ("Also run on the host's servers")
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
    def setup(self) -> tuple:
        """What it ran: its preset, and for a custom session its own cap (its number)."""
        return (self.preset, self.custom, self.number if self.custom else None)

    @property
    def result_after_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.pressed_s

    @property
    def estimate_error(self) -> float | None:
        """(estimate - actual wait) / actual wait, for a session told an estimate (its wait ends
        when its run starts, or when it is shown an identical run's result); a wait under
        ``MIN_WAIT_S`` counts as that long (nobody can tell a 2 s wait from a 5 s one), and an
        estimate under 90 s covers the 10 s the page rounds it to ("a few seconds" is 0 to 5 s)."""
        end_s = self.done_s if self.shown_at_once else self.started_s  # shown: its wait ends there
        if self.first_estimate_s is None or end_s is None:
            return None
        actual_s = end_s - self.estimate_told_s
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
        link = f"{url.rstrip('/')}/?preset={preset['slug']}&slots={int(preset.get('slots', 3))}"
        links[preset["slug"]] = (link, first.split("\n")[0][:30])
    return links


def _value(output):
    """A component's value as ``gradio_client`` hands it (a dict with ``value``, or plain)."""
    return output.get("value", output) if isinstance(output, dict) else output


def status_line(outputs) -> str:
    """The status line among one update of /run's ``outputs``."""
    return str(_value(outputs[STATUS_INDEX]))


def run_knobs(**values) -> tuple:
    """/run's ``RUN_KNOBS`` inputs: each knob's default (``engine.knobs``) unless ``values``
    names it."""
    return tuple(values.get(name, KNOB[name].default) for name in RUN_KNOBS)


def _setup(url: str, session: Session, names: dict[str, str]):
    """A client that chose the session's preset as a person would (``/apply_preset``), and the
    /run inputs it would send: the table (one cap changed for a custom session), slots, knobs,
    and by name the servers it ticks."""
    from gradio_client import Client

    # A person's browser fetches a run's files only when they click one; a client that fetched
    # every file of every update (gradio_client's default), each over a new SSL context, takes a
    # room's sessions much of a small machine's CPU away from the page they measure.
    client = Client(url, verbose=False, download_files=False)
    chosen = client.predict(names[session.preset], api_name="/apply_preset")
    table, chat, _text, slots = chosen[:4]  # then the engine settings, all defaults in the tour
    table = _value(table)
    if session.custom:  # one cap changed: a setup nobody ran
        table["data"][0][1] = int(table["data"][0][1]) + 1 + session.number
    inputs = (table, _value(slots), *run_knobs(chat_template=chat))
    return client, inputs, {"server_names": list(session.servers)}


def run_session(url: str, session: Session, t0: float, names: dict[str, str]) -> None:
    """Choose the session's preset, press Run, and read its stream into ``session``."""
    try:
        client, inputs, named = _setup(url, session, names)
        session.pressed_s = time.monotonic() - t0
        job = client.submit(*inputs, **named, replay_recent=True, api_name="/run")
        for update in updates(job):  # the final result is the last of them
            read_status(session, status_line(update), time.monotonic() - t0)
        if not session.statuses:
            raise RuntimeError("no result")
        session.done_s = time.monotonic() - t0
        take_times(session)
    except Exception as exc:  # noqa: BLE001  (any failure is the session's result, reported)
        session.error = f"{type(exc).__name__}: {exc}"


def as_remote(fn, cpus: set[int] | None = None):
    """``fn``, run at nice ``CLIENT_NICE`` on the thread that calls it, and kept to ``cpus`` if
    given (``clients_cpus``: the page's own): Linux keeps a nice value and a CPU set per thread,
    and the threads and processes a thread starts (gradio_client's, Chromium) inherit them. Where
    either cannot be set, ``fn`` runs without it."""

    def run(*args):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CLIENT_NICE)
            if cpus:
                os.sched_setaffinity(0, cpus)  # 0: this thread, on Linux
        except (AttributeError, OSError):  # not Linux, or not allowed: the clients compete
            pass
        return fn(*args)

    return run


def clients_cpus(page_pid: int) -> set[int] | None:
    """The CPUs for a room's clients and browsers: those of the page's process ``page_pid`` when
    it keeps to fewer than this machine's (the engines have the others: ``CBP_ENGINE_CPUS``), so
    that the clients, who stand in for people on other machines, take no time from the runs they
    measure (unpinned browsers opening the page slow its run); None (no restriction) when the
    page has every CPU or its set cannot be read."""
    try:
        page, every = os.sched_getaffinity(page_pid), os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux, or the process is gone
        return None
    return page if page < every else None


def updates(job):
    """Each of ``job``'s streamed outputs once, as read every ``POLL_S`` seconds (the pattern
    gradio_client's ``Job.outputs`` documents), until the job is done."""
    seen = 0
    while True:
        done = job.done()  # before reading: the outputs read after it are all there are
        outputs = job.outputs()
        yield from outputs[seen:]
        seen = len(outputs)
        if done:
            return
        time.sleep(POLL_S)


def read_status(session: Session, status: str, now_s: float) -> None:
    """Note what one status line says: streamed Markdown, or the text a browser shows."""
    if session.statuses and session.statuses[-1] == status:
        return
    session.statuses.append(status)
    status = status.replace("**", "")
    if status.startswith("Waiting for the model:"):
        found = ESTIMATE.search(status)
        if found and session.first_estimate_s is None:
            scale = 60.0 if found[2] == "min" else 1.0
            session.first_estimate_s = float(found[1] or 0) * scale
            session.estimate_told_s = now_s
    elif status.startswith("Running") and session.started_s is None:
        session.started_s = now_s
    elif status.startswith("Shown at once:"):
        session.shown_at_once = True


def run_session_live(url: str, session: Session, names: dict[str, str]) -> None:
    """``run_session`` with ``replay_recent`` off: a fresh measurement, its result awaited."""
    client, inputs, named = _setup(url, session, names)
    result = client.predict(*inputs, **named, replay_recent=False, api_name="/run")
    read_status(session, status_line(result), 0.0)
    take_times(session)


def take_times(session: Session) -> None:
    """The engines' times from a finished session's last status line (an error if none, or if
    its Run was refused or stopped: the page then shows the run before it, whose times are not
    this one's)."""
    last = session.statuses[-1]
    plain, found = last.replace("**", ""), STATUS_TIMES.search(last)
    if plain.startswith("Not run"):
        session.error = f"refused: {plain[:160]!r}"
    elif plain.startswith("Stopped"):  # nobody pressed Stop in a room
        session.error = f"stopped: {plain[:160]!r}"
    elif found is None:
        session.error = f"no engine times in the final status: {last[:120]!r}"
    else:
        session.static_s, session.continuous_s = float(found[1]), float(found[2])
