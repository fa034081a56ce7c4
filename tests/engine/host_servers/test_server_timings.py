"""A server still starting in the queue's estimates: what is left of its start, counted once, and
each local server's last start kept on this host across page restarts.

Expected values are worked by hand from the numbers in each test, not read from the code.
"""

from __future__ import annotations

import json

import pytest

from engine.host_queue.run_cost import Pace, Work
from engine.host_queue.run_queue import RunQueue
from engine.host_servers import server_timings
from engine.host_servers.server_set import ServerSet, Unbuilt
from engine.llamacpp.engines import LlamaCppEngine
from tests.live_servers import needs_llamacpp

# A made-up host: our continuous step 0.1 s (2 s for 20 steps), vLLM's stage 10 s, rendering
# 1 s. A run with vLLM costs 13 s, 3 s of it before its vLLM stage; one of ours alone 3 s.
WITH_VLLM = Work(continuous_steps=20, servers=("vllm",))
OURS_ONLY = Work(continuous_steps=20)
VLLM_KEY = {
    "format": server_timings.FORMAT,
    "cpu": "a made-up CPU",
    "machine": "x86_64",
    "server": "vllm",
    "mode": "compiled",
    "model": "/models/smol",
    "dtype": "float32",
    "threads": 2,
}


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _queue(ready_in_s: dict[str, float]) -> RunQueue:
    """A queue at the made-up host's pace whose servers are ready in ``ready_in_s`` seconds."""
    pace = Pace.uniform(0.1, run_s=1.0)
    pace.learn(WITH_VLLM, 13.0, {"continuous": 2.0, "server:vllm": 10.0})
    queue = RunQueue(pace=pace, clock=Clock(), stale_s=1e9)
    queue.start_left_s = lambda name: ready_in_s.get(name, 0.0)
    return queue


def test_a_run_behind_one_that_waits_for_a_servers_start_is_told_the_start_left():
    """The running run ticked vLLM, ready in 100 s: the run behind is told 100 s, then vLLM's
    10 s stage: 110 s (its 3 s before that stage run meanwhile). vLLM ready: 13 s; a start of
    2 s left, within those 3 s, adds nothing: 13 s."""
    ready_in_s = {"vllm": 100.0}
    queue = _queue(ready_in_s)
    running, behind = queue.join("running", WITH_VLLM), queue.join("behind", WITH_VLLM)
    assert queue.wait_turn(running, timeout_s=0)
    assert queue.place(behind).estimate_now_s == pytest.approx(110.0), "the start was not added"
    ready_in_s["vllm"] = 0.0
    assert queue.place(behind).estimate_now_s == pytest.approx(13.0), "a ready server added time"
    ready_in_s["vllm"] = 2.0
    assert queue.place(behind).estimate_now_s == pytest.approx(13.0), "a short start added time"


def test_a_start_that_two_runs_ahead_wait_for_counts_once():
    """The running run and the next both tick vLLM, ready in 100 s: the third is told 110 s for
    the first, then 13 s for the second, which finds vLLM ready: 123 s (not the start twice,
    223 s). With a run of ours alone running (3 s), the run with vLLM after it reaches its stage
    at 6 s and waits to 100 s: the third is told 110 s."""
    queue = _queue({"vllm": 100.0})
    tickets = [queue.join(f"s{i}", WITH_VLLM) for i in range(3)]
    assert queue.wait_turn(tickets[0], timeout_s=0)
    assert queue.place(tickets[2]).estimate_now_s == pytest.approx(123.0)
    queue = _queue({"vllm": 100.0})
    ours, with_vllm, third = (
        queue.join(f"t{i}", w) for i, w in enumerate((OURS_ONLY, WITH_VLLM, WITH_VLLM))
    )
    assert queue.wait_turn(ours, timeout_s=0)
    assert queue.place(third).estimate_now_s == pytest.approx(110.0)


def test_a_running_run_in_its_server_stage_after_a_start_is_told_the_stage_left():
    """The running run did its 20 steps, then waited 100 s for vLLM's start: 4 s into vLLM's
    10 s stage, the run behind is told 6 s (not 0 s: the running run's time so far, 104 s, is
    past its 13 s cost); 8 s into it, 2 s."""
    ready_in_s = {"vllm": 100.0}
    queue = _queue(ready_in_s)
    running, behind = queue.join("running", WITH_VLLM), queue.join("behind", WITH_VLLM)
    assert queue.wait_turn(running, timeout_s=0)
    queue.progress(running, 20)
    queue.clock.now_s += 100.0
    ready_in_s["vllm"] = 0.0
    queue.server_began(running, "vllm")
    queue.clock.now_s += 4.0
    assert queue.place(behind).estimate_now_s == pytest.approx(6.0), "the stage left is lost"
    queue.clock.now_s += 4.0
    assert queue.place(behind).estimate_now_s == pytest.approx(2.0)


def test_a_server_that_failed_to_start_adds_nothing():
    """A local server whose build is missing is failed from the start: nothing is left of its
    start, and a server the host does not have adds nothing either."""
    servers = ServerSet({"vllm": Unbuilt("no vLLM here; build it with `make vllm`.")})
    assert servers.start_left_s("vllm") == 0.0


def test_what_is_left_of_a_start_never_falls_under_a_tenth_of_it():
    """A start expected to take 150 s has 100 s left 50 s in; 200 s in, it still runs and is
    told 15 s (a tenth of 150 s), not 0 s."""
    assert server_timings.start_left_s(150.0, 50.0) == pytest.approx(100.0)
    assert server_timings.start_left_s(150.0, 200.0) == pytest.approx(15.0)


def test_a_start_kept_in_the_cache_folder_is_read_back_after_a_restart(tmp_path, monkeypatch):
    """With nothing kept, vLLM compiled is expected to take its prior; a start of 152.3 s kept
    in a real cache folder is what a later reading (a restarted page) expects, for its key only
    (eager keeps its prior); a file that holds another key, or is not JSON, gives the prior."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    prior_s = server_timings.PRIOR_START_S[("vllm", "compiled")]
    assert server_timings.expected_start_s(VLLM_KEY) == prior_s
    assert server_timings.keep_start(VLLM_KEY, 152.3)
    path = server_timings.start_path(VLLM_KEY)
    assert path.parent == tmp_path / server_timings.FOLDER and path.is_file(), path
    assert server_timings.expected_start_s(VLLM_KEY) == pytest.approx(152.3), "not read back"
    eager = {**VLLM_KEY, "mode": "eager"}
    assert server_timings.expected_start_s(eager) == server_timings.PRIOR_START_S[("vllm", "eager")]
    path.write_text(json.dumps({"key": eager, "start_s": 9.0}), encoding="utf-8")
    assert server_timings.expected_start_s(VLLM_KEY) == prior_s, "another key's start was used"
    path.write_text("{half a file", encoding="utf-8")
    assert server_timings.expected_start_s(VLLM_KEY) == prior_s, "a corrupt file was used"


@needs_llamacpp
def test_the_page_keeps_a_servers_measured_start_for_the_next_page(
    embedded_model, tmp_path, monkeypatch
):
    """llama.cpp's Q4 server, started for real by the page's servers, keeps its measured start
    in the cache folder, and adds nothing once ready; the servers of a page started after it
    expect that start, and before it starts are told all of it as left."""
    engines = [LlamaCppEngine(embedded_model, 1, name="llamacpp_q4") for _ in range(2)]
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))  # after the engines found their GGUF
    first = ServerSet({"llamacpp_q4": engines[0]})
    try:
        first.start().wait_ready("llamacpp_q4", lambda _note: None)
        measured_s = engines[0].server.start_s
        assert first.start_left_s("llamacpp_q4") == 0.0, "a ready server has start left"
    finally:
        first.close()
    assert list((tmp_path / server_timings.FOLDER).glob("*.json")), "no start kept"
    again = ServerSet({"llamacpp_q4": engines[1]})
    assert again.expected_start_s("llamacpp_q4") == pytest.approx(measured_s)
    assert again.start_left_s("llamacpp_q4") == pytest.approx(measured_s)
