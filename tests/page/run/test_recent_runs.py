"""Recent runs by setup: kept for the replay window, the oldest dropped first, labelled honestly."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.page.run.recent_runs import RecentRuns, replay_label, replay_window_s


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_run_is_found_within_the_window_and_not_after():
    """A kept run is found by its setup until the window has passed, then never again."""
    clock = Clock()
    recent = RecentRuns(window_s=60, clock=clock)
    recent.keep(("setup", 1), "state", ["a.csv"])
    clock.now_s += 59
    found = recent.find(("setup", 1))
    assert found is not None and found.state == "state" and found.downloads == ["a.csv"]
    assert recent.age_s(found) == pytest.approx(59)
    assert recent.find(("setup", 2)) is None, "another setup was found"
    clock.now_s += 2
    assert recent.find(("setup", 1)) is None, "a run past the window was found"


def test_a_newer_run_of_a_setup_replaces_the_older_and_the_oldest_setup_goes_first():
    """Keeping a setup again replaces its run; past ``max_runs`` the least recent setup goes."""
    recent = RecentRuns(window_s=60, max_runs=2)
    recent.keep("a", 1)
    recent.keep("b", 2)
    recent.keep("a", 3)
    recent.keep("c", 4)
    assert recent.find("b") is None, "the least recently kept setup stayed"
    assert recent.find("a").state == 3 and recent.find("c").state == 4


def test_a_zero_window_keeps_nothing():
    """``CBP_REPLAY_WINDOW_S=0``: every Run runs live."""
    recent = RecentRuns(window_s=0)
    recent.keep("a", 1)
    assert recent.find("a") is None


@pytest.mark.parametrize(
    ("value", "expected"), [("", 600.0), ("0", 0.0), (" 90 ", 90.0), ("2.5", 2.5)]
)
def test_the_window_setting_is_read(value, expected):
    """Blank means the default; seconds otherwise."""
    assert replay_window_s({"CBP_REPLAY_WINDOW_S": value}) == expected


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_bad_window_setting_is_refused_with_its_name(value):
    """A negative, non-numeric or infinite window is refused, naming the variable."""
    with pytest.raises(ValueError, match="CBP_REPLAY_WINDOW_S"):
        replay_window_s({"CBP_REPLAY_WINDOW_S": value})


def test_the_label_says_when_and_where_it_was_measured():
    """The label gives the local time, the age and that the setup is identical."""
    recent = RecentRuns(window_s=600)
    recent.keep("a", 1)
    run = recent.find("a")
    at = time.strftime("%H:%M", time.localtime(run.measured_at))
    assert replay_label(run, 12) == f"measured at {at} on this host, 12 s ago, identical setup"
    assert replay_label(run, 180).startswith(f"measured at {at} on this host, 3 min ago")


def test_a_run_is_drawn_once_per_axis_however_many_are_shown_it():
    """``RecentRun.drawn`` calls its draw once per key, even for people asking at the same
    moment, and keeps each key's drawing apart."""
    runs = RecentRuns(window_s=60.0)
    runs.keep("seed", state="trace")
    run = runs.find("seed")
    calls = []

    def draw(axis):
        def drawing():
            calls.append(axis)
            time.sleep(0.05)  # long enough for the other threads to ask meanwhile
            return {"axis": axis}

        return drawing

    with ThreadPoolExecutor(max_workers=4) as pool:
        drawings = list(pool.map(lambda _: run.drawn("time", draw("time")), range(4)))
    assert calls == ["time"]
    assert all(d is drawings[0] for d in drawings)
    assert run.drawn("steps", draw("steps")) == {"axis": "steps"}
    assert calls == ["time", "steps"]
    runs.keep("seed", state="trace again")  # a new run of the setup starts with no drawings
    assert runs.find("seed").drawn("time", draw("time")) == {"axis": "time"}
    assert calls == ["time", "steps", "time"]
