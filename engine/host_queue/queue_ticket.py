"""A run's ticket in the queue, and what its waiting person is told: a place and a wait.

Places count runs, not sessions: a waiting run whose setup is already ahead takes no turn and is
told that run's place (``run_places``)::

    in line:  seed (running)  custom  seed  seed  custom  live
    place:    1               2       1     1     2       3      total 3

The told wait counts down and moves to a fresh estimate only past a tolerance (±30 %, the error
docs/measurements.md holds estimates to; floor: the queue line's own step under 90 s).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from engine.host_queue.run_cost import Pace, Work

TOLD_TOLERANCE_SHARE = 0.3  # a fresh estimate this share off the countdown is told
TOLD_TOLERANCE_S = 10.0  # ... and at least this many seconds off it
# The running run's pace counts once it has done this many steps since its first report: its
# first steps carry its prompts' prefill, so a pace taken at once reads many times too slow.
MIN_PROGRESS_STEPS = 20


@dataclass
class ToldWait:
    told_s: float | None = None
    at_s: float = 0.0

    def tell(self, estimate_s: float | None, now_s: float) -> float | None:
        """The wait to tell at ``now_s``: the last one counted down, or ``estimate_s`` if far
        off."""
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
    # a server started on the host while it stepped: its slowdown is the start's, not the host's
    beside_start: bool = False
    # when each server's stage began streaming, by name (``RunQueue.server_began``)
    servers_began_s: dict[str, float] = field(default_factory=dict)
    # its references still to compute, as read after the queue's nth ended run
    # (``RunQueue._missing_now``)
    missing: tuple[int, Mapping[Hashable, int]] | None = field(default=None, repr=False)
    told: ToldWait = field(default_factory=ToldWait, repr=False)  # the wait it was told last

    def left_s(self, pace: Pace, now: float, slowdown: float = 1.0) -> float:
        """What is left of its running run: cost less time so far, at least its steps left and,
        once a server's stage began, the stages left (a wait for a start counts as time so far)."""
        left_s = pace.cost_s(self.work, slowdown=slowdown) - (now - self.started_s)
        if self.steps_done:
            left = pace.engine_s_left(self.work, self.steps_done)
            left_s = max(left_s, slowdown * left)
        begun = [i for i, name in enumerate(self.work.servers) if name in self.servers_began_s]
        if begun:
            left_s = max(left_s, self._stages_left_s(pace, now, begun[-1]))
        return max(0.0, left_s)

    def _stages_left_s(self, pace: Pace, now: float, last: int) -> float:
        """The rest of server stage ``last`` (begun), and the stages after it in full."""
        names = list(self.work.servers)
        stages_s = [pace.server_stage_s(self.work, name) for name in names]
        begun_s = self.servers_began_s[names[last]]
        return max(0.0, stages_s[last] - (now - begun_s)) + sum(stages_s[last + 1 :])

    def progress_pace(self) -> Pace | None:
        """Its run's pace between its first and last step reports (None: too few yet)."""
        if self.first_steps is None or self.steps_done_s is None:
            return None
        first, first_s = self.first_steps
        if self.steps_done - first < MIN_PROGRESS_STEPS:
            return None
        elapsed_s = self.steps_done_s - first_s  # to when they were done, not now
        return Pace.from_progress(self.work, elapsed_s, self.steps_done - first)


@dataclass(frozen=True)
class Place:
    """A waiting person's ``place`` (with ``identical_ahead``: that run's), ``total`` runs in
    line, ``estimate_s`` (None: nothing measured) and ``after_running``."""

    place: int
    total: int
    waited_s: float
    estimate_s: float | None
    running: bool = False
    after_running: bool = False
    identical_ahead: bool = False  # a run of its setup is ahead: shown when it ends, at estimate_s
    estimate_now_s: float | None = None  # the queue's own estimate now, before ``ToldWait``


def run_places(setups: Sequence[Hashable | None]) -> tuple[list[int], int]:
    """Each entry's place and the runs in line, from the setups in order (None: always a turn)."""
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
