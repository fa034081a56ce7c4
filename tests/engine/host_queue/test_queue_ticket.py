"""A ticket's place among the runs in line, and the wait it is told counting down."""

from __future__ import annotations

import pytest

from engine.host_queue.queue_ticket import TOLD_TOLERANCE_S, ToldWait, run_places


def test_places_count_each_setup_once_and_every_live_run():
    """The line of the module's picture: a setup already ahead takes the place of that run and
    adds none; a run with no setup always takes a turn."""
    setups = ["seed", "custom", "seed", "seed", "custom", None, None]
    places, runs = run_places(setups)
    assert places == [1, 2, 1, 1, 2, 3, 4], places
    assert runs == 4, runs
    assert run_places([]) == ([], 0)


def test_a_told_wait_stops_at_zero_and_starts_again_after_no_estimate():
    """Counted down past its end the wait told is 0 while the queue's estimate stays within the
    tolerance, not below 0; with no estimate (no pace any more) nothing is told, and the next
    estimate is told as it is."""
    told = ToldWait()
    assert told.tell(20.0, now_s=0.0) == 20.0
    assert told.tell(5.0, now_s=30.0) == 0.0, "not counted down to 0"
    assert told.tell(TOLD_TOLERANCE_S + 1, now_s=31.0) == pytest.approx(TOLD_TOLERANCE_S + 1)
    assert told.tell(None, now_s=32.0) is None
    assert told.tell(50.0, now_s=33.0) == 50.0, "an estimate after none was not told as it is"
