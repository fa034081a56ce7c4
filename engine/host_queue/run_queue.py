"""The host's queue of runs: one run on the model at a time, and a true place and wait for the rest.

Gradio's queue tells a browser only its own place and a mean of past events, so the page keeps
its own; what a person is told: docs/hosting.md, "Runs take turns".
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from engine.host_queue.queue_ticket import Place, Ticket, run_places
from engine.host_queue.run_cost import REFERENCE, Pace, Work, over_limit, server_part
from engine.serving.run_control import run_time_limit_s

STALE_S = 60.0  # a waiting ticket whose handler polls, not asked about for this long, is dropped
LENT_STALE_S = 600.0  # ... and one whose line Gradio holds (``RunQueue.lend``)
# The running run's pace over the learned one, as applied to the wait of the runs behind it
# (unless a server started beside it: ``Ticket.beside_start``).
SLOWDOWN_RANGE = (0.5, 3.0)

log = logging.getLogger(__name__)  # DEBUG: each finished run's parts, each estimate's terms


@dataclass
class RunQueue:
    """First come, first served turns on the model, with places and estimates for the waiting.

    A ticket nobody asked about for ``stale_s`` (``lent_stale_s`` while Gradio holds its line) is
    dropped, a last resort."""

    clock: Callable[[], float] = time.monotonic
    stale_s: float = STALE_S
    lent_stale_s: float = LENT_STALE_S
    shown_instead: Callable[[Hashable], bool] = lambda setup: False
    # seconds until the host's server of that name is ready (0: ready or failed; ``ServerSet``)
    start_left_s: Callable[[str], float] = lambda name: 0.0
    starting: Callable[[], bool] = lambda: False  # a server on the host is starting
    pace: Pace = field(default_factory=Pace)  # learned from the runs that finished here
    _waiting: list[Ticket] = field(default_factory=list)
    _running: Ticket | None = None
    _runs_ended: int = 0  # runs that took the model and gave it back
    _calibrated_only: bool = False  # the pace is the one timed at start (``calibrate``)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def measured(self) -> bool:
        return self.pace.known

    def join(self, session: str, work: Work | int, setup: Hashable | None = None) -> Ticket:
        """Queue a run of ``work`` for ``session``; ``setup``: costs no turn when an identical
        run is ahead. Raises ValueError: the session has a run queued, or it is over the limit."""
        with self._changed:
            if any(t.session == session for t in self._tickets()):
                raise ValueError(
                    "Your run is already in the queue: it starts by itself. "
                    "Press Stop first to change it."
                )
            now = self.clock()
            work = work if isinstance(work, Work) else Work.of_steps(work)
            if (refusal := over_limit(self._own_cost_s(work), run_time_limit_s())) is not None:
                raise ValueError(refusal)
            ticket = Ticket(session, work, now, seen_s=now, setup=setup)
            self._waiting.append(ticket)
            return ticket

    def wait_turn(self, ticket: Ticket, timeout_s: float) -> bool:
        """Wait up to ``timeout_s``; True once the model is ``ticket``'s (ValueError: not
        queued)."""
        with self._changed:
            if self._running is ticket:
                return True
            self._check_waiting(ticket)
            self._changed.wait_for(
                lambda: self._is_next(ticket) or ticket not in self._waiting, timeout=timeout_s
            )
            self._check_waiting(ticket)
            if not self._is_next(ticket):
                return False
            self._waiting.remove(ticket)
            ticket.started_s = self.clock()
            self._running = ticket
            return True

    def lend(self, ticket: Ticket) -> None:
        """Gradio holds the handler's line and may resume late: stale after ``lent_stale_s``."""
        with self._changed:
            ticket.seen_s, ticket.lent = self.clock(), True

    def leave(self, ticket: Ticket) -> None:
        with self._changed:
            if self._running is ticket:
                self._running = None
                self._runs_ended += 1
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._changed.notify_all()

    def calibrate(self, work: Work, parts_s: dict[str, float]) -> None:
        """Teach the pace timed at start unless a run already taught one (the first finished run
        replaces it: a busy start can time it too slow)."""
        with self._changed:
            if not self.pace.known:  # the engines' parts by name, the rest as the reference's
                self.pace.learn(work, sum(parts_s.values()) + self.pace.run_s, parts_s)
                self._calibrated_only = True

    def progress(self, ticket: Ticket, steps_done: int, done_s: float | None = None) -> None:
        """The running ``ticket`` has done ``steps_done`` engine steps at ``done_s`` (None: now)."""
        with self._changed:
            if int(steps_done) > ticket.steps_done:
                at_s = self.clock() if done_s is None else done_s
                ticket.steps_done, ticket.steps_done_s = int(steps_done), at_s
                ticket.beside_start = ticket.beside_start or self.starting()
                if ticket.first_steps is None:
                    ticket.first_steps = (ticket.steps_done, ticket.steps_done_s)

    def server_began(self, ticket: Ticket, name: str, at_s: float | None = None) -> None:
        """The running ``ticket``'s stage on server ``name`` began streaming at ``at_s`` (None:
        now); the first report counts."""
        with self._changed:
            ticket.servers_began_s.setdefault(name, self.clock() if at_s is None else at_s)

    def finish(
        self, ticket: Ticket, wall_s: float, parts_s: dict[str, float] | None = None
    ) -> None:
        with self._changed:
            if wall_s > 0:
                beside_start = ticket.beside_start  # then it teaches only the servers' stages
                if self._calibrated_only and not beside_start:  # a run outweighs the start's
                    ratios = self.pace.server_ratios  # kept here, not timed at start
                    self.pace, self._calibrated_only = Pace(server_ratios=ratios), False
                self.pace.learn(ticket.work, wall_s, parts_s, beside_start)
                log.debug("run joined at %.1f ended in %.1f s: parts %s, units %s",
                          ticket.joined_s, wall_s, _rounded(parts_s or {}),
                          _rounded(ticket.work.units()))  # fmt: skip
        self.leave(ticket)

    def place(self, ticket: Ticket) -> Place:
        """``ticket``'s ``Place`` now; place 0 and ``running`` once it has the model."""
        with self._changed:
            now = self.clock()
            if self._running is ticket:
                total = run_places([t.setup for t in self._tickets()])[1]
                return Place(0, total, now - ticket.joined_s, 0.0, running=True)
            self._check_waiting(ticket)  # first: it may drop stale tickets
            places, total = run_places([t.setup for t in self._tickets()])
            index = self._waiting.index(ticket)
            after_running = self._running is not None
            terms = [] if log.isEnabledFor(logging.DEBUG) else None
            ahead = self._waiting[:index]
            estimate_s, identical = self._wait_estimate_s(ahead, now, ticket.setup, terms)
            told_s = ticket.told.tell(estimate_s, now)
            if terms is not None and estimate_s is not None and ticket.told.at_s == now:  # afresh
                log.debug("run joined at %.1f told %.0f s: %s", ticket.joined_s, told_s,
                          "; ".join(terms))  # fmt: skip
            return Place(
                places[index + after_running],
                total,
                now - ticket.joined_s,
                told_s,
                after_running=after_running,
                identical_ahead=identical,
                estimate_now_s=estimate_s,
            )

    def size(self) -> int:
        with self._changed:
            return len(self._tickets())

    def _wait_estimate_s(
        self, ahead: list[Ticket], now: float, setup: Hashable | None = None, terms=None
    ) -> tuple[float | None, bool]:
        """Seconds until a run behind ``ahead`` starts (None: no pace), and whether its setup is;
        ``terms`` gets a line per run counted, for the log."""
        running = self._running
        pace = self.pace if self.pace.known else running.progress_pace() if running else None
        setups = set() if running is None or running.setup is None else {running.setup}
        identical = setup is not None and (setup in setups or any(t.setup == setup for t in ahead))
        if pace is None:
            return None, identical
        computed = {} if running is None else dict(running.work.references)  # key -> cap
        slowdown = self._slowdown() if self.pace.known else 1.0  # else the pace is the progress
        # a start's load on the engines' CPUs ends before the runs behind run (vLLM compiles)
        behind = 1.0 if running is not None and running.beside_start else slowdown
        limit_s = run_time_limit_s()  # a run is stopped there, whatever its work
        ready_in_s = functools.cache(self.start_left_s)
        wait_s = 0.0
        if running is not None and not (running.setup and self.shown_instead(running.setup)):
            left_s = running.left_s(pace, now, slowdown)
            cap_s = None if limit_s is None else max(0.0, limit_s - (now - running.started_s))
            wait_s = after_starts(running.work, pace, 0.0, left_s, ready_in_s, cap_s)
            if terms is not None:
                ends = f"slowdown {slowdown:.2f} ({behind:.2f} behind), the running run ends"
                terms.append(f"{ends} at {wait_s:.0f} s")
        if identical and setup in setups:
            return wait_s, True
        for t in ahead:  # a setup already ahead is measured once; the rest are shown that run
            free = t.setup is not None and (t.setup in setups or self.shown_instead(t.setup))
            if not free:
                missing = self._missing_now(t)
                refs = {k: c for k, c in missing.items() if computed.get(k, -1) < c}
                cost_s = pace.cost_s(t.work, refs, behind)
                begin_s = wait_s
                wait_s = after_starts(t.work, pace, wait_s, cost_s, ready_in_s, limit_s)
                computed.update(refs)
                if terms is not None:
                    terms.append(_term(t, pace, refs, begin_s, wait_s))
            if identical and t.setup == setup:
                return wait_s, True
            if t.setup is not None:
                setups.add(t.setup)
        return wait_s, identical

    def _own_cost_s(self, work: Work) -> float | None:
        """``work``'s seconds at the learned pace (None: none yet), less references done ahead."""
        if self._calibrated_only:
            return None
        computed: dict[Hashable, int] = {}  # key -> the largest cap a run in line computes
        for t in self._tickets():
            for key, cap in t.work.references.items():
                computed[key] = max(cap, computed.get(key, -1))
        refs = {k: c for k, c in work.references.items() if computed.get(k, -1) < c}
        return self.pace.cost_s(work, refs)

    def _missing_now(self, ticket: Ticket) -> Mapping[Hashable, int]:
        """``ticket``'s missing references, re-read only after a run ended (costly to read)."""
        if ticket.missing is None or ticket.missing[0] != self._runs_ended:
            ticket.missing = (self._runs_ended, ticket.work.missing_now())
        return ticket.missing[1]

    def _slowdown(self) -> float:
        """The running run's slowdown against the pace (1 before ``MIN_PROGRESS_STEPS``,
        clipped)."""
        progress = self._running.progress_pace() if self._running is not None else None
        if progress is None:
            return 1.0
        ratio = progress.s_per_unit() / self.pace.s_per_unit()
        return min(max(ratio, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])

    def _check_waiting(self, ticket: Ticket) -> None:
        """Note that ``ticket``'s handler asked; drop stale tickets (ValueError: not waiting)."""
        now = self.clock()
        ticket.seen_s, ticket.lent = now, False
        stale = [t for t in self._waiting if self._stale(t, now)]
        for t in stale:
            self._waiting.remove(t)
        if stale:
            self._changed.notify_all()
        if ticket not in self._waiting:
            raise ValueError("this run is no longer in the queue")

    def _is_next(self, ticket: Ticket) -> bool:
        if self._waiting and self._stale(self._waiting[0], self.clock()):
            self._check_waiting(ticket)  # the first in line went quiet: drop it
        return self._running is None and bool(self._waiting) and self._waiting[0] is ticket

    def _stale(self, ticket: Ticket, now: float) -> bool:
        return now - ticket.seen_s > (self.lent_stale_s if ticket.lent else self.stale_s)

    def _tickets(self) -> list[Ticket]:
        return ([self._running] if self._running is not None else []) + self._waiting


def _term(ticket: Ticket, pace: Pace, refs, begin_s: float, end_s: float) -> str:
    """One run's line in an estimate's log: its span and its parts at ``pace``."""
    work = ticket.work
    parts = {
        "engines": pace.engines_s(work),
        "references": work.units(refs)[REFERENCE] * pace.s_per_unit(REFERENCE),
        "run": pace.run_s,
        **{server_part(n): pace.server_stage_s(work, n) for n in work.servers},
    }
    return f"run joined at {ticket.joined_s:.1f}: {begin_s:.0f}-{end_s:.0f} s {_rounded(parts)}"


def _rounded(seconds: Mapping[str, float]) -> dict[str, float]:
    return {name: round(s, 2) for name, s in seconds.items()}


def after_starts(
    work: Work,
    pace: Pace,
    begin_s: float,
    cost_s: float,
    ready_in_s: Callable[[str], float],
    cap_s: float | None = None,
) -> float:
    """When a run of ``work`` ends, in seconds from now: it begins at ``begin_s``, costs ``cost_s``
    and waits at each server's stage until it is ready, ``ready_in_s(name)`` from now; at most
    ``cap_s`` after it begins. A run behind finds the server ready: each start counts once."""
    end_s = begin_s + cost_s
    if any(ready_in_s(name) > 0 for name in work.servers):
        stages_s = [pace.server_stage_s(work, name) for name in work.servers]
        at_s = begin_s + max(0.0, cost_s - sum(stages_s))  # where its first server's stage begins
        for name, stage_s in zip(work.servers, stages_s, strict=True):
            at_s = max(at_s, ready_in_s(name)) + stage_s
        end_s = max(end_s, at_s)
    return end_s if cap_s is None else min(end_s, begin_s + cap_s)
