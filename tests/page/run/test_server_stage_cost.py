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
from engine.host_queue.run_cost import RUN_S, SERVER_STEP_RATIO, Pace, Work, run_work
from engine.host_queue.run_queue import RunQueue
from engine.host_servers import server_timings
from engine.host_servers.server_set import ServerSet
from engine.llamacpp.engines import LlamaCppEngine
from engine.page.run.run import StageClock
from engine.page.run.run_options import RunOptions
from tests.live_servers import needs_llamacpp

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


def test_a_server_not_run_here_yet_is_priced_at_its_prior_ratio_to_our_engines_pace():
    """Before a server's first run here its stage costs its continuous steps at
    ``SERVER_STEP_RATIO`` times our engines' pace: 2 s of ours + ratio * 2 s of vLLM + 1 s
    rendering."""
    expected_s = 2.0 + SERVER_STEP_RATIO * 2.0 + 1.0
    assert Pace.uniform(0.1, run_s=1.0).cost_s(WITH_VLLM) == pytest.approx(expected_s)
    assert SERVER_STEP_RATIO > 1.0, "a server's step priced no dearer than ours"


def test_a_servers_ratio_learned_from_its_runs_prices_it_on_a_pace_of_its_own():
    """One run with vLLM at 0.5 s a step beside ours at 0.1 s (ratio 5): a page restarted with
    that ratio kept, on a host now twice as slow (ours 0.2 s a step), prices vLLM's 20 steps at
    5 * 0.2 * 20 = 20 s; llama.cpp, never run, stays at its prior ratio."""
    ratios = _taught().server_ratios
    assert ratios == {"vllm": pytest.approx(5.0)}, ratios
    restarted = Pace.uniform(0.2, run_s=1.0)
    restarted.server_ratios.update(ratios)
    assert restarted.server_stage_s(WITH_VLLM, "vllm") == pytest.approx(20.0)
    expected_s = SERVER_STEP_RATIO * 0.2 * 20
    assert restarted.server_stage_s(WITH_VLLM, "llamacpp") == pytest.approx(expected_s)


def test_a_pace_timed_at_start_gives_way_to_a_run_but_keeps_the_servers_ratios():
    """The first finished run replaces the pace timed at start, but not the servers' ratios kept
    from before this page: a run without servers has nothing to say about them."""
    queue = RunQueue(clock=Clock(), stale_s=1e9)
    queue.calibrate(Work(continuous_steps=20), {"continuous": 2.0})
    queue.pace.server_ratios["vllm"] = 3.0  # as the page reads it from the cache folder
    ticket = queue.join("a", Work(continuous_steps=10))
    assert queue.wait_turn(ticket, timeout_s=0)
    queue.finish(ticket, 3.0, {"continuous": 2.0})
    assert queue.pace.s_per_unit("continuous") == pytest.approx(0.2), "the run was not learned"
    assert queue.pace.server_ratios == {"vllm": 3.0}, queue.pace.server_ratios


def test_a_servers_ratio_is_kept_in_the_cache_folder_for_its_key(tmp_path, monkeypatch):
    """A ratio kept in a real cache folder reads back for its key only; another key's file or a
    corrupt one reads as none (the prior)."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    key = {"format": 1, "cpu": "a made-up CPU", "server": "vllm", "mode": "compiled"}
    assert server_timings.kept_step_ratio(key) is None
    assert server_timings.keep_step_ratio(key, 1.7)
    path = server_timings.stage_path(key)
    assert path.parent == tmp_path / server_timings.STAGE_FOLDER and path.is_file(), path
    assert server_timings.kept_step_ratio(key) == pytest.approx(1.7)
    assert server_timings.kept_step_ratio({**key, "mode": "eager"}) is None, "another key's ratio"
    path.write_text("{half a file", encoding="utf-8")
    assert server_timings.kept_step_ratio(key) is None, "a corrupt file was used"


@needs_llamacpp
def test_the_pages_servers_keep_their_ratios_for_the_next_page(
    embedded_model, tmp_path, monkeypatch
):
    """llama.cpp's Q4 server's ratio, kept by the page's servers, is what the servers of a page
    started after it read; a name that is no local server is not kept."""
    engines = [LlamaCppEngine(embedded_model, 1, name="llamacpp_q4") for _ in range(2)]
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))  # after the engines found their GGUF
    ServerSet({"llamacpp_q4": engines[0]}).keep_stage_ratios({"llamacpp_q4": 2.5, "x": 9.0})
    assert ServerSet({"llamacpp_q4": engines[1]}).stage_ratios() == {"llamacpp_q4": 2.5}
    assert len(list((tmp_path / server_timings.STAGE_FOLDER).glob("*.json"))) == 1


def test_a_servers_stage_is_priced_from_its_own_runs():
    """After one run with vLLM (13 s: 2 s ours, 10 s vLLM, 1 s the rest), a run with vLLM costs
    2 + 10 + 1 = 13 s; one without it 2 + 1 = 3 s (vLLM's time was not taught to the run's own
    seconds); one with llama.cpp too adds its 20 steps at its prior ratio to our pace."""
    pace = _taught()
    assert pace.run_s == 1.0, f"a server's stage leaked into the run's own seconds: {pace.run_s}"
    assert pace.cost_s(WITH_VLLM) == 13.0
    assert pace.cost_s(Work(continuous_steps=20)) == 3.0
    both = Work(continuous_steps=20, servers=("vllm", "llamacpp"))
    assert pace.cost_s(both) == pytest.approx(13.0 + SERVER_STEP_RATIO * 2.0)
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
    with caplog.at_level(logging.DEBUG, logger="engine.host_queue.run_queue"):
        queue.place(behind)
        clock.now_s += 1.0
        queue.place(behind)  # the same estimate, counted down: not logged again
        queue.finish(running, WALL_S, TIMED)
    told, ended = [r.getMessage() for r in caplog.records]
    assert "told 13 s" in told and "the running run ends at 13 s" in told, told
    assert "ended in 13.0 s" in ended and "'server:vllm': 10.0" in ended, ended


def test_a_run_beside_a_servers_start_teaches_only_its_servers_stages():
    """A first run whose engines stepped while vLLM started (at three times the pace timed at
    start, 0.3 s a step) and which waited 100 s for that start (130 s in all) teaches vLLM's
    10 s stage, but neither its engines' pace nor the start's wait as the run's own seconds,
    nor a ratio to engines that were slowed; the next run, beside no start, teaches them."""
    state = {"starting": True}
    queue = RunQueue(clock=Clock(), stale_s=1e9)
    queue.starting = lambda: state["starting"]
    queue.calibrate(Work(continuous_steps=20), {"continuous": 2.0})  # 0.1 s a step
    run_s = queue.pace.run_s
    first = queue.join("first", WITH_VLLM)
    assert queue.wait_turn(first, timeout_s=0)
    queue.progress(first, 20)
    queue.finish(first, 130.0, {"continuous": 6.0, "server:vllm": 10.0})
    pace = queue.pace
    assert pace.s_per_unit("continuous") == pytest.approx(0.1), "the slowed engines were learned"
    assert pace.run_s == pytest.approx(run_s), f"the start's wait leaked into the run: {pace.run_s}"
    assert pace.s_per_unit("server:vllm") == pytest.approx(0.5) and not pace.server_ratios
    state["starting"] = False
    second = queue.join("second", WITH_VLLM)
    assert queue.wait_turn(second, timeout_s=0)
    queue.progress(second, 20)
    queue.finish(second, 13.0, TIMED)
    assert queue.pace.s_per_unit("continuous") == pytest.approx(0.1)
    assert queue.pace.run_s == pytest.approx((RUN_S + 1.0) / 2), "halfway from the prior"
    assert queue.pace.server_ratios == {"vllm": pytest.approx(5.0)}, queue.pace.server_ratios
