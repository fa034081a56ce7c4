"""The host's servers' stages in the queue's estimates: each server priced from its own runs, its
time kept out of the other parts, and a line of server runs counting down as people move up.

Expected values are worked by hand from the numbers in each test, not read from the code.
"""

from __future__ import annotations

import logging
import random

import pytest
from tiny_model import make_requests

from engine.config import EngineConfig
from engine.page.run.run import StageClock
from engine.page.run.run_cost import Pace, Work, run_work
from engine.page.run.run_options import RunOptions
from engine.page.run.run_queue import RunQueue

# A run of 20 continuous steps with vLLM after our engines. On this made-up host a step of ours
# takes 0.1 s (2 s), vLLM's stage 10 s (0.5 s a step) and rendering 1 s: 13 s in all.
WITH_VLLM = Work(continuous_steps=20, servers=("vllm",))
TIMED = {"continuous": 2.0, "server:vllm": 10.0}
WALL_S = 13.0


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _taught() -> Pace:
    """Our engines at 0.1 s a step and 1 s a run, then one run of WITH_VLLM learned."""
    pace = Pace.uniform(0.1, run_s=1.0)
    pace.learn(WITH_VLLM, WALL_S, TIMED)
    return pace


def test_a_server_not_run_here_yet_is_priced_at_our_engines_pace():
    """Before a server's first run here its stage costs its continuous steps at our engines'
    pace: 2 s of ours + 2 s of vLLM + 1 s rendering = 5 s."""
    assert Pace.uniform(0.1, run_s=1.0).cost_s(WITH_VLLM) == 5.0


def test_a_servers_stage_is_priced_from_its_own_runs():
    """After one run with vLLM (13 s: 2 s ours, 10 s vLLM, 1 s the rest), a run with vLLM costs
    2 + 10 + 1 = 13 s; one without it 2 + 1 = 3 s (vLLM's time was not taught to the run's own
    seconds); one with llama.cpp too adds its 20 steps at our pace, 2 s: 15 s."""
    pace = _taught()
    assert pace.run_s == 1.0, f"a server's stage leaked into the run's own seconds: {pace.run_s}"
    assert pace.cost_s(WITH_VLLM) == 13.0
    assert pace.cost_s(Work(continuous_steps=20)) == 3.0
    assert pace.cost_s(Work(continuous_steps=20, servers=("vllm", "llamacpp"))) == 15.0
    assert pace.engines_s(WITH_VLLM) == 2.0, "the servers' stages counted as our engines' steps"


def test_a_servers_stage_waits_for_the_last_arrival():
    """A server replays the arrivals, so its stage lasts at least the last one's: with the last
    at 5 s, ours 5 s, vLLM 5 s (not 2 s), rendering 1 s: 11 s."""
    work = Work(continuous_steps=20, min_wall_s=5.0, servers=("vllm",))
    assert Pace.uniform(0.1, run_s=1.0).cost_s(work) == 11.0


def test_moving_up_a_line_of_server_runs_counts_the_wait_down():
    """Three runs with vLLM ahead, each 13 s as priced: the fourth is told 39 s, then 26 s and
    13 s as each ends on time; its estimate never rises while it moves up."""
    clock = Clock()
    queue = RunQueue(pace=_taught(), clock=clock, stale_s=1e9)
    ahead = [queue.join(f"s{i}", WITH_VLLM) for i in range(3)]
    last = queue.join("last", WITH_VLLM)
    told = []
    for ticket in ahead:
        assert queue.wait_turn(ticket, timeout_s=0), "the run ahead did not take the model"
        place = queue.place(last)
        told.append((place.estimate_now_s, place.estimate_s))
        clock.now_s += WALL_S
        queue.finish(ticket, WALL_S, TIMED)
    assert told == [(39.0, 39.0), (26.0, 26.0), (13.0, 13.0)], told


def test_a_runs_work_names_the_servers_it_runs():
    """A run's work carries the servers ticked, so their stages are priced."""
    requests = make_requests([("hello", 4), ("abc", 6)])
    options = RunOptions(check_reference=False, servers=("vllm", "llamacpp"))
    work = run_work(requests, EngineConfig(num_slots=2), options)
    assert work.servers == ("vllm", "llamacpp"), work.servers
    assert work.server_parts() == ["server:vllm", "server:llamacpp"]


def test_each_servers_stage_is_timed_from_its_first_report_to_the_next_servers():
    """vLLM reports at 0 s (waiting for it) and 3 s, llama.cpp first at 10 s and done at 14 s,
    read at 15 s: vLLM's stage 10 s, llama.cpp's 5 s; every report is passed on as it came."""
    clock, seen = Clock(), []
    stages = StageClock(lambda *args, **named: seen.append((args, named)), clock=clock)
    for at_s, name, done in ((0, "vllm", False), (3, "vllm", True), (10, "llamacpp", False)):
        clock.now_s = 100.0 + at_s
        stages.watch(name, None, done=done)
    clock.now_s = 114.0
    stages.watch("llamacpp", None, done=True)
    clock.now_s = 115.0
    assert stages.stages_s() == {"vllm": 10.0, "llamacpp": 5.0}
    assert [args[0] for args, _ in seen] == ["vllm", "vllm", "llamacpp", "llamacpp"]
    assert [named["done"] for _, named in seen] == [False, True, False, True]


def test_a_wait_for_a_servers_own_start_is_not_its_stage():
    """vLLM still starting at 0 s and 40 s (the page's first minute), ready at 45 s, its next
    server's first report at 57 s: its stage is 57 - 45 = 12 s; llama.cpp, never ready (it
    failed to start), is timed from its first report at 57 s to 60 s: 3 s."""
    clock, ready = Clock(), set()
    stages = StageClock(lambda *a, **k: None, ready=ready.__contains__, clock=clock)
    for at_s, name in ((0, "vllm"), (40, "vllm"), (45, "vllm"), (57, "llamacpp")):
        if at_s == 45:
            ready.add("vllm")
        clock.now_s = 100.0 + at_s
        stages.watch(name, None, waiting=True)
    clock.now_s = 160.0
    assert stages.stages_s() == {"vllm": 12.0, "llamacpp": 3.0}


# A made-up host: our continuous step 0.1 s, rendering 1.5 s; each server's stage a fixed part
# (a restart, its client's set-up) and a part per continuous step, as (fixed s, s per step).
SERVER_COSTS = {"vllm": (4.0, 0.3), "llamacpp": (2.0, 0.05)}
SERVER_MIXES = [(), ("vllm",), ("llamacpp",), ("vllm", "llamacpp")]


def _host_run(steps: int, servers: tuple[str, ...]) -> tuple[Work, float, dict[str, float]]:
    """A run of ``steps`` continuous steps and ``servers`` on the made-up host: its work, wall
    seconds and timed parts."""
    parts = {"continuous": 0.1 * steps}
    for name in servers:
        fixed_s, step_s = SERVER_COSTS[name]
        parts[f"server:{name}"] = fixed_s + step_s * steps
    return Work(continuous_steps=steps, servers=servers), sum(parts.values()) + 1.5, parts


def test_with_servers_ticked_a_queues_wait_is_within_30_percent():
    """After four finished runs mixing the servers, the next five runs' wait (a queue's) is
    within ±30 % of what they take, each server priced by its own runs."""
    rng = random.Random(4)  # the old model (servers in the run's own seconds): 2.26 times
    pace = Pace()
    for i in range(4):
        work, wall_s, parts = _host_run(rng.randint(50, 300), SERVER_MIXES[i % 4])
        pace.learn(work, wall_s, parts)
    ahead = [_host_run(rng.randint(50, 300), rng.choice(SERVER_MIXES)) for _ in range(5)]
    estimate_s = sum(pace.cost_s(work) for work, _, _ in ahead)
    actual_s = sum(wall_s for _, wall_s, _ in ahead)
    assert abs(estimate_s / actual_s - 1) <= 0.30, (estimate_s, actual_s)


def test_our_engines_slowdown_does_not_stretch_a_servers_stage():
    """Our engines at twice their learned pace stretch their own 2 s and the run's 1 s, not
    vLLM's 10 s: 2 * (2 + 1) + 10 = 16 s, not 2 * 13 = 26 s."""
    assert _taught().cost_s(WITH_VLLM, slowdown=2.0) == 16.0


def test_a_running_runs_slow_steps_stretch_only_its_own_parts_of_the_wait():
    """A 100-step run with vLLM, learned at 0.1 s a step, 0.5 s a vLLM step and 1 s of
    rendering (61 s), goes 40 steps in 8 s (0.2 s a step: slowdown 2). At 8.2 s the run behind
    it waits 2 * (10 + 1) + 50 - 8.2 = 63.8 s (stretched whole, it would be 113.8 s)."""
    clock, work = Clock(), Work(continuous_steps=100, servers=("vllm",))
    pace = Pace.uniform(0.1, run_s=1.0)
    pace.learn(work, 61.0, {"continuous": 10.0, "server:vllm": 50.0})
    queue = RunQueue(pace=pace, clock=clock, stale_s=1e9)
    running, behind = queue.join("running", work), queue.join("behind", work)
    assert queue.wait_turn(running, timeout_s=0)
    queue.progress(running, 1, done_s=clock.now_s + 0.2)
    queue.progress(running, 41, done_s=clock.now_s + 8.2)
    clock.now_s += 8.2
    assert queue.place(behind).estimate_now_s == pytest.approx(63.8)


def test_at_debug_an_estimate_and_a_finished_run_log_their_parts(caplog):
    """The log says what an estimate was made of (each run's parts) and what a run took."""
    clock = Clock()
    queue = RunQueue(pace=_taught(), clock=clock, stale_s=1e9)
    running, behind = queue.join("running", WITH_VLLM), queue.join("behind", WITH_VLLM)
    assert queue.wait_turn(running, timeout_s=0)
    with caplog.at_level(logging.DEBUG, logger="engine.page.run.run_queue"):
        queue.place(behind)
        clock.now_s += 1.0
        queue.place(behind)  # the same estimate, counted down: not logged again
        queue.finish(running, WALL_S, TIMED)
    told, ended = [r.getMessage() for r in caplog.records]
    assert "told 13 s" in told and "the running run ends at 13 s" in told, told
    assert "ended in 13.0 s" in ended and "'server:vllm': 10.0" in ended, ended
