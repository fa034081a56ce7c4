"""The page's queue of runs: one run on the model at a time, and a true place and wait for the rest.

A run is a measurement, so runs never share the model: they take turns. Gradio's own queue would
do that (``concurrency_limit=1``), but what it tells a waiting browser is its own view: the place
it sends can equal the total, and its estimate is the mean of past events, whatever they were. This
queue is the page's own, so every waiting person is told their true place among the runs in line
(``queue_ticket``) and an estimate from the work ahead: each run's cost at this host's pace
(``run_cost``), plus what is left of the running one. A run whose setup is already ahead counts
nothing, since it will be shown that run when it finishes (``setup``), and a reference a run ahead
computes is not counted again. A session has one run in the queue at a time.

No run lasts longer than the host's per-run limit (``CBP_RUN_TIME_LIMIT_S``, read at every
estimate): the time limit stops it there. So each run ahead counts at most that limit, and the
running one at most what is left of it. ``join`` refuses a run whose own cost is well over it
(``run_cost.over_limit``), but only on a pace learned from a run that finished here: the pace
timed at start (``calibrate``) can come out many times too slow on a busy machine.

``wait_turn`` blocks a handler's thread until its run is first and the model is free, in slices, so
that the handler can stream its place between them::

    ticket = queue.join(session, work)                # ValueError: this session already waits
    while not queue.wait_turn(ticket, timeout_s=1.0):
        line = place_line(queue.place(ticket))
        queue.lend(ticket)                            # Gradio holds it until it asks again
        yield line
    try:
        run()                                         # the model is this ticket's;
        queue.progress(ticket, steps_done)            # its engine steps so far, now and then
    finally:
        queue.finish(ticket, wall_s, parts_s)         # frees the model, teaches the pace

A ticket that leaves (Stop, a closed tab, a reload) is taken out wherever it stands: Stop and
Gradio's own disconnect signals (``demo.unload``, and the close of the handler's generator) call
``leave``. Staleness is only a last resort against a handler that vanished without leaving. While
a handler's generator has yielded its line to Gradio (``lend``), Gradio holds it: it either asks
again or closes it, however late its event loop gets there on a busy host, so a lent ticket
goes stale only after ``LENT_STALE_S``; a polling one after ``STALE_S`` without a poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from engine.page.run.queue_ticket import Place, Ticket, run_places
from engine.page.run.run_cost import Pace, Work, over_limit
from engine.serving.run_control import run_time_limit_s

STALE_S = 60.0  # a waiting ticket whose handler polls, not asked about for this long, is dropped
LENT_STALE_S = 600.0  # ... and one whose line Gradio holds (``RunQueue.lend``)
# The running run's pace over the learned one, as applied to the wait of the runs behind it.
SLOWDOWN_RANGE = (0.5, 3.0)


@dataclass
class RunQueue:
    """First come, first served turns on the model, with places and estimates for the waiting.

    ``pace``: the host's seconds per step unit of each part, taught by the finished runs (or
    given; before one, estimates come from the running run's progress). ``clock``: seconds,
    monotonic (a test passes its own). ``stale_s``, ``lent_stale_s``: a waiting ticket nobody
    asked about for this long is dropped (lent: its line held by Gradio, ``lend``).
    ``shown_instead(setup)``: whether a run of that setup would now be
    shown an earlier run (the page's recent runs), so it costs no wait.
    """

    clock: Callable[[], float] = time.monotonic
    stale_s: float = STALE_S
    lent_stale_s: float = LENT_STALE_S
    shown_instead: Callable[[Hashable], bool] = lambda setup: False
    pace: Pace = field(default_factory=Pace)  # learned from the runs that finished here
    _waiting: list[Ticket] = field(default_factory=list)
    _running: Ticket | None = None
    _runs_ended: int = 0  # runs that took the model and gave it back
    _calibrated_only: bool = False  # the pace is the one timed at start (``calibrate``)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def measured(self) -> bool:
        """Whether a pace is known: a run finished here, or the page timed one at start
        (``calibrate``); else estimates come from the running run's progress."""
        return self.pace.known

    def join(self, session: str, work: Work | int, setup: Hashable | None = None) -> Ticket:
        """Queue a run of ``work`` (or of that many engine steps) for ``session``; ``setup``: its
        setup, when an identical run finishing first would be shown to it instead (it then
        costs no turn).

        Raises:
            ValueError: this session already has a run waiting or running, or the run's own cost
                at the pace learned here is well over the host's per-run limit (the message
                gives its estimate, the limit and what to change: ``run_cost.over_limit``).
        """
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
        """Wait up to ``timeout_s`` for ``ticket``'s turn; True once the model is its own. A
        ticket taken out meanwhile (Stop, ``leave``) ends the wait at once.

        Raises:
            ValueError: the ticket is not in the queue (it left, or it already ran).
        """
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
        """``ticket``'s handler yields its line to Gradio: until it asks again, it is not stale
        short of ``lent_stale_s``. Gradio resumes a yielded generator only after sending that line
        and every other tab's outputs queued before it, which a busy host can delay for more than
        ``stale_s``; a tab that goes away closes it instead (which leaves the queue)."""
        with self._changed:
            ticket.seen_s, ticket.lent = self.clock(), True

    def leave(self, ticket: Ticket) -> None:
        """Take ``ticket`` out, waiting or running (a run that ends without a measurement)."""
        with self._changed:
            if self._running is ticket:
                self._running = None
                self._runs_ended += 1
            elif ticket in self._waiting:
                self._waiting.remove(ticket)
            self._changed.notify_all()

    def calibrate(self, work: Work, parts_s: dict[str, float]) -> None:
        """Teach the pace a run of ``work`` timed at start, ``parts_s`` seconds in each part, as
        if it had finished here (its rendering at the prior ``run_cost.RUN_S``), unless a run
        already taught one. So the first estimates come from a quiet page, not from the first
        run's early steps, which a room's joins slow. The first run that finishes replaces this
        pace rather than averaging with it: a start on a busy machine (another page's run, say)
        can time a pace many times too slow."""
        with self._changed:
            if not self.pace.known:  # the engines' parts by name, the rest as the reference's
                self.pace.learn(work, sum(parts_s.values()) + self.pace.run_s, parts_s)
                self._calibrated_only = True

    def progress(self, ticket: Ticket, steps_done: int, done_s: float | None = None) -> None:
        """The running ``ticket``'s run has done ``steps_done`` engine steps, at ``done_s`` by
        the queue's clock (None: now; a report read late says when they were done)."""
        with self._changed:
            if int(steps_done) > ticket.steps_done:
                at_s = self.clock() if done_s is None else done_s
                ticket.steps_done, ticket.steps_done_s = int(steps_done), at_s
                if ticket.first_steps is None:
                    ticket.first_steps = (ticket.steps_done, ticket.steps_done_s)

    def finish(
        self, ticket: Ticket, wall_s: float, parts_s: dict[str, float] | None = None
    ) -> None:
        """``ticket``'s run ended after ``wall_s`` seconds, ``parts_s`` of them in each engine
        (None: unknown): free the model and teach the pace (``run_cost.Pace.learn``)."""
        with self._changed:
            if wall_s > 0:
                if self._calibrated_only:  # a real run here outweighs the pace timed at start
                    self.pace, self._calibrated_only = Pace(), False
                self.pace.learn(ticket.work, wall_s, parts_s)
        self.leave(ticket)

    def place(self, ticket: Ticket) -> Place:
        """Where ``ticket`` stands now among the runs in line (``queue_ticket``), and the wait it
        is told (``ToldWait``); place 0 and ``running`` once it has the model."""
        with self._changed:
            now = self.clock()
            if self._running is ticket:
                total = run_places([t.setup for t in self._tickets()])[1]
                return Place(0, total, now - ticket.joined_s, 0.0, running=True)
            self._check_waiting(ticket)  # first: it may drop stale tickets
            places, total = run_places([t.setup for t in self._tickets()])
            index = self._waiting.index(ticket)
            after_running = self._running is not None
            estimate_s, identical = self._wait_estimate_s(self._waiting[:index], now, ticket.setup)
            return Place(
                places[index + after_running],
                total,
                now - ticket.joined_s,
                ticket.told.tell(estimate_s, now),
                after_running=after_running,
                identical_ahead=identical,
                estimate_now_s=estimate_s,
            )

    def size(self) -> int:
        """Tickets running or waiting, every session's (identical runs each counted)."""
        with self._changed:
            return len(self._tickets())

    def _wait_estimate_s(
        self, ahead: list[Ticket], now: float, setup: Hashable | None = None
    ) -> tuple[float | None, bool]:
        """Seconds until a run behind ``ahead`` starts (None: no pace yet), and whether a run of
        its ``setup`` is ahead: then it is shown that run when it ends, so the wait ends there
        (counted to the end of the queue, a room waiting for a setup already running would be
        told several times its wait)."""
        running = self._running
        pace = self.pace if self.pace.known else running.progress_pace() if running else None
        setups = set() if running is None or running.setup is None else {running.setup}
        identical = setup is not None and (setup in setups or any(t.setup == setup for t in ahead))
        if pace is None:
            return None, identical
        computed = {} if running is None else dict(running.work.references)  # key -> cap
        slowdown = self._slowdown() if self.pace.known else 1.0  # else the pace is the progress
        limit_s = run_time_limit_s()  # a run is stopped there, whatever its work
        wait_s = 0.0
        if running is not None and not (running.setup and self.shown_instead(running.setup)):
            left_s = running.left_s(pace, now, slowdown)
            if limit_s is not None:
                left_s = min(left_s, max(0.0, limit_s - (now - running.started_s)))
            wait_s += left_s
        if identical and setup in setups:
            return wait_s, True
        for t in ahead:  # a setup already ahead is measured once; the rest are shown that run
            free = t.setup is not None and (t.setup in setups or self.shown_instead(t.setup))
            if not free:
                missing = self._missing_now(t)
                refs = {k: c for k, c in missing.items() if computed.get(k, -1) < c}
                cost_s = pace.cost_s(t.work, refs, slowdown)
                wait_s += cost_s if limit_s is None else min(cost_s, limit_s)
                computed.update(refs)
            if identical and t.setup == setup:
                return wait_s, True
            if t.setup is not None:
                setups.add(t.setup)
        return wait_s, identical

    def _own_cost_s(self, work: Work) -> float | None:
        """``work``'s own seconds here at the pace learned from finished runs (None: none yet, or
        only the pace timed at start); of its references (those missing as it joins), those a
        run in line computes are left out."""
        if self._calibrated_only:
            return None
        computed: dict[Hashable, int] = {}  # key -> the largest cap a run in line computes
        for t in self._tickets():
            for key, cap in t.work.references.items():
                computed[key] = max(cap, computed.get(key, -1))
        refs = {k: c for k, c in work.references.items() if computed.get(k, -1) < c}
        return self.pace.cost_s(work, refs)

    def _missing_now(self, ticket: Ticket) -> Mapping[Hashable, int]:
        """``ticket``'s references still to compute (``Work.missing_now``), read again only once a
        run ended since: a reference is stored by the run that computes it. Read at every look of
        every waiting run, the reference store would cost a room's page CPU under this queue's
        lock."""
        if ticket.missing is None or ticket.missing[0] != self._runs_ended:
            ticket.missing = (self._runs_ended, ticket.work.missing_now())
        return ticket.missing[1]

    def _slowdown(self) -> float:
        """How much slower than the learned pace the running run's engine steps go, as of its last
        report (1 before ``MIN_PROGRESS_STEPS``; clipped to ``SLOWDOWN_RANGE``): the load on the
        page now (people joining, a busy machine) is the best guess of the load while those
        ahead run; estimates from the learned pace alone fall short while a room's joins slow the
        first runs."""
        progress = self._running.progress_pace() if self._running is not None else None
        if progress is None:
            return 1.0
        ratio = progress.s_per_unit() / self.pace.s_per_unit()
        return min(max(ratio, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])

    def _check_waiting(self, ticket: Ticket) -> None:
        """Note that ``ticket``'s handler asked, and drop the waiting tickets nobody asks about.

        Raises:
            ValueError: ``ticket`` is not waiting (it left, was dropped, or already ran).
        """
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
        """Whether nobody asked about ``ticket`` for longer than its bound (lent or polling)."""
        return now - ticket.seen_s > (self.lent_stale_s if ticket.lent else self.stale_s)

    def _tickets(self) -> list[Ticket]:
        """The line: the running run, then the waiting."""
        return ([self._running] if self._running is not None else []) + self._waiting
