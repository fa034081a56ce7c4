"""A run's ticket in the queue, and what its waiting person is told: a place and a wait.

A ``Ticket`` holds what the queue knows of one run: whose it is, its work, its setup, and once it
runs, its steps so far (from which its own pace: ``progress_pace``, and what is left of it:
``left_s``). ``RunQueue.place`` tells its person a ``Place``.

**Places count runs, not sessions.** A run in line is a turn on the model: the running run and
each waiting one that will run. A waiting run whose setup is already ahead of it (running or
waiting: ``RunQueue.join``'s ``setup``) takes no turn, since it is shown that run when it ends;
so it adds no place for those behind it, and is told the place of that run. Every session is
told the same ``total``. A run with no setup (run live anyway) always takes a turn::

    in line:  seed (running)  custom  seed  seed  custom  live
    place:    1               2       1     1     2       3      total 3

**The estimate counts down.** Each ticket keeps the wait it was last told and when
(``ToldWait``); what it is told next is that wait less the time since, unless the queue's fresh
estimate is past a tolerance from it. The fresh estimate moves with things that barely move the
wait (the running run's slowdown re-read at each report of its steps, a finished run moving the
pace), and told as it is, the line would read 70, 60, 80, 50 s. The tolerance's share is the error
the room measurements hold an estimate to (within ±30 %, ``docs/measurements.md``): a change past
it (a run ahead left, the run in progress ran slower than its estimate) is told at once. Its floor
is the queue line's own step under 90 s, below which a change shows as a flip between two words.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from engine.page.run.run_cost import Pace, Work

TOLD_TOLERANCE_SHARE = 0.3  # a fresh estimate this share off the countdown is told
TOLD_TOLERANCE_S = 10.0  # ... and at least this many seconds off it
# The running run's pace counts once it has done this many steps since its first report: its
# first steps carry its prompts' prefill, so a pace taken at once reads many times too slow.
MIN_PROGRESS_STEPS = 20


@dataclass
class ToldWait:
    """The wait one ticket was last told (None: none yet) and when, by the queue's clock."""

    told_s: float | None = None
    at_s: float = 0.0

    def tell(self, estimate_s: float | None, now_s: float) -> float | None:
        """The wait to tell now, given the queue's fresh ``estimate_s``: the last one told counted
        down to ``now_s``, unless ``estimate_s`` is past the tolerance from it (or none was told,
        or there is no estimate any more); then ``estimate_s``, kept as the new one told."""
        if estimate_s is None:
            self.told_s = None
            return None
        if self.told_s is not None:
            left_s = max(0.0, self.told_s - (now_s - self.at_s))
            if abs(estimate_s - left_s) <= max(TOLD_TOLERANCE_S, TOLD_TOLERANCE_SHARE * left_s):
                return left_s
        self.told_s, self.at_s = estimate_s, now_s
        return estimate_s


@dataclass
class Ticket:
    """One run's place in the queue: whose it is, how much work it is, and when it joined."""

    session: str
    work: Work  # what the run will do, in the parts the estimate prices
    joined_s: float
    started_s: float | None = None  # when it took the model; None while it waits
    seen_s: float = 0.0  # when its handler last asked for its turn or place
    lent: bool = False  # its handler yielded its line to Gradio since (``RunQueue.lend``)
    # what it runs, when it may be shown a run of the same setup instead (None: it runs live)
    setup: Hashable | None = None
    steps_done: int = 0  # its engine steps so far, once it runs (``RunQueue.progress``)
    steps_done_s: float | None = None  # when those steps were reported (the queue's clock)
    # its first report of steps (count, when): its pace is timed from there (``progress_pace``)
    first_steps: tuple[int, float] | None = None
    # its references still to compute, as read after the queue's nth ended run
    # (``RunQueue._missing_now``)
    missing: tuple[int, Mapping[Hashable, int]] | None = field(default=None, repr=False)
    told: ToldWait = field(default_factory=ToldWait, repr=False)  # the wait it was told last

    def left_s(self, pace: Pace, now: float, slowdown: float = 1.0) -> float:
        """What is left of its run, once it runs: its cost (at the ``slowdown`` it shows) less its
        time so far, and at least its engine steps not yet done at that pace."""
        left_s = pace.cost_s(self.work, slowdown=slowdown) - (now - self.started_s)
        if self.steps_done:
            left = pace.engine_s_left(self.work, self.steps_done)
            left_s = max(left_s, slowdown * left)
        return max(0.0, left_s)

    def progress_pace(self) -> Pace | None:
        """Its run's pace, once it runs, from its first report of steps to its last (None before
        ``MIN_PROGRESS_STEPS`` between them): the estimates' pace until one is learned, then
        their slowdown. Not from its start: what comes before its first step (the job handed to
        the engine process, its first prompts' prefill) is no pace of its steps, and timed from
        the start a run reads slower than it goes."""
        if self.first_steps is None or self.steps_done_s is None:
            return None
        first, first_s = self.first_steps
        if self.steps_done - first < MIN_PROGRESS_STEPS:
            return None
        elapsed_s = self.steps_done_s - first_s  # to when they were done, not now
        return Pace.from_progress(self.work, elapsed_s, self.steps_done - first)


@dataclass(frozen=True)
class Place:
    """What a waiting person is told (the module docstring says how places and totals count):
    ``place`` in line among the runs, the run in progress first (with ``identical_ahead``, the
    place of the run of its setup ahead); ``total``: the runs in line; ``estimate_s``: the wait
    until this run starts, or with ``identical_ahead`` until that run ends and is shown to it
    (None: nothing measured yet); ``after_running``: a run is in progress ahead of this one."""

    place: int
    total: int
    waited_s: float
    estimate_s: float | None
    running: bool = False
    after_running: bool = False
    identical_ahead: bool = False  # a run of its setup is ahead: shown when it ends, at estimate_s
    estimate_now_s: float | None = None  # the queue's own estimate now, before ``ToldWait``


def run_places(setups: Sequence[Hashable | None]) -> tuple[list[int], int]:
    """The place each entry in line waits for, and the number of runs in line, from the setups in
    line order (the running run's first; None: a run that always takes a turn)."""
    places, first_place = [], {}
    runs = 0
    for setup in setups:
        if setup is not None and setup in first_place:  # shown that run: no turn of its own
            places.append(first_place[setup])
            continue
        runs += 1
        places.append(runs)
        if setup is not None:
            first_place[setup] = runs
    return places, runs
