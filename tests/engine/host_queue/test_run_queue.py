"""The host's run queue: true places and totals, estimates from the work ahead, one run each."""

from __future__ import annotations

import threading

import pytest

from engine.host_queue.queue_ticket import MIN_PROGRESS_STEPS
from engine.host_queue.run_cost import LIMIT_MARGIN, Pace, Work
from engine.host_queue.run_queue import SLOWDOWN_RANGE, RunQueue


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_places_and_totals_count_every_session():
    """With one run going and three waiting, the waiting are told places 2, 3, 4 of 4: the run in
    progress is first in line, so the last is told the total."""
    queue = RunQueue()
    first = queue.join("a", 10)
    assert queue.wait_turn(first, timeout_s=0)
    waiting = [queue.join(s, 10) for s in "bcd"]
    places = [queue.place(t) for t in waiting]
    assert [(p.place, p.total) for p in places] == [(2, 4), (3, 4), (4, 4)], places
    assert all(p.after_running for p in places), places
    assert queue.place(first).running and queue.size() == 4


def test_a_session_queues_one_run_at_a_time():
    """A second Run from a session that waits (or runs) is refused with a message; after its run
    ends the session may queue again."""
    queue = RunQueue()
    ticket = queue.join("a", 5)
    with pytest.raises(ValueError, match="already in the queue"):
        queue.join("a", 5)
    assert queue.wait_turn(ticket, timeout_s=0)
    with pytest.raises(ValueError, match="already in the queue"):
        queue.join("a", 5)
    queue.finish(ticket, wall_s=1.0)
    assert queue.join("a", 5).session == "a"


def test_estimate_is_the_work_ahead_at_the_hosts_rate():
    """The wait is the steps ahead times seconds per step, plus what is left of the running run
    (here with no time of its own for rendering)."""
    clock = Clock()
    queue = RunQueue(pace=Pace.uniform(0.5, run_s=0.0), clock=clock, stale_s=1e9)
    running = queue.join("a", 100)  # 50 s of work
    assert queue.wait_turn(running, timeout_s=0)
    second, third = queue.join("b", 20), queue.join("c", 40)
    clock.now_s += 30  # 20 s left of the running run
    assert queue.place(second).estimate_s == pytest.approx(20.0)
    assert queue.place(third).estimate_s == pytest.approx(20.0 + 10.0)
    assert queue.place(third).waited_s == pytest.approx(30.0)
    clock.now_s += 100  # the running run is late: nothing more is counted for it
    assert queue.place(second).estimate_s == pytest.approx(0.0)


def test_no_estimate_before_anything_was_measured_and_finished_runs_teach_it():
    """Without a rate there is no estimate; each finished run moves the rate towards its own."""
    queue = RunQueue()
    first = queue.join("a", 100)
    second = queue.join("b", 100)
    assert queue.place(second).estimate_s is None
    assert queue.wait_turn(first, timeout_s=0)
    queue.finish(first, wall_s=20.0 + queue.pace.run_s)  # 20 s of steps, then rendering
    assert queue.pace.s_per_unit() == pytest.approx(0.2) and queue.measured
    assert queue.place(second).estimate_s == pytest.approx(0.0), "nothing is ahead any more"
    assert queue.wait_turn(second, timeout_s=0)
    queue.finish(second, wall_s=40.0 + queue.pace.run_s)
    assert queue.pace.s_per_unit() == pytest.approx(0.3), "half way from 0.2 to 0.4"


def test_before_any_run_finished_the_running_runs_progress_gives_the_pace():
    """The first run's steps over their time, from its first report of steps, price the runs
    behind it; a running run slower than its estimate counts its steps not yet done."""
    clock = Clock()
    queue = RunQueue(clock=clock, stale_s=1e9)
    first, second = queue.join("a", 100), queue.join("b", 50)
    assert queue.wait_turn(first, timeout_s=0)
    clock.now_s += 10
    assert queue.place(second).estimate_s is None, "no steps yet, no pace"
    queue.progress(first, 1)  # its first step, 10 s after it took the model
    clock.now_s += 5
    queue.progress(first, MIN_PROGRESS_STEPS)
    assert queue.place(second).estimate_s is None, "a pace from its first few steps"
    clock.now_s += 5
    queue.progress(first, 21)  # 20 steps in 10 s: 0.5 s a step
    assert not queue.measured
    assert queue.place(second).estimate_s == pytest.approx(79 * 0.5), "79 steps left at 0.5 s"
    clock.now_s += 60  # slower than that: 30 steps in 70 s
    queue.progress(first, 31)
    clock.now_s += 5  # the next report is late: the pace is as of the last one
    assert queue.place(second).estimate_s == pytest.approx(69 * 70 / 30), "its 69 steps left"


def test_leaving_moves_the_rest_up_and_frees_the_model():
    """A waiting run that leaves is gone from the places; a running one that leaves frees the
    model for the next."""
    queue = RunQueue()
    first, second, third = (queue.join(s, 1) for s in "abc")
    assert queue.wait_turn(first, timeout_s=0)
    queue.leave(second)
    assert queue.place(third).place == 2 and queue.size() == 2
    with pytest.raises(ValueError, match="no longer in the queue"):
        queue.place(second)
    assert not queue.wait_turn(third, timeout_s=0), "the model is still the first run's"
    queue.leave(first)
    assert queue.wait_turn(third, timeout_s=0)


def test_threads_take_the_model_in_order_of_arrival_one_at_a_time():
    """Eight handler threads joined in order run in that order, never two at once."""
    queue = RunQueue()
    order, holding, overlaps = [], [], []
    tickets = [queue.join(f"s{i}", 1) for i in range(8)]

    def handler(ticket):
        while not queue.wait_turn(ticket, timeout_s=0.05):
            pass
        holding.append(ticket)
        overlaps.append(len(holding) > 1)
        order.append(ticket.session)
        holding.remove(ticket)
        queue.finish(ticket, wall_s=0.001)

    threads = [threading.Thread(target=handler, args=(t,)) for t in reversed(tickets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert order == [f"s{i}" for i in range(8)], order
    assert not any(overlaps), "two runs held the model at once"


def test_a_waiting_run_nobody_asks_about_is_dropped_and_cannot_hold_the_line():
    """A handler that stopped asking (its generator no longer iterated) loses its place after
    ``stale_s``, so the runs behind it move up and take the model."""
    clock = Clock()
    queue = RunQueue(clock=clock, stale_s=10)
    gone, waiting = queue.join("gone", 1), queue.join("waiting", 1)
    clock.now_s += 5
    assert queue.place(waiting).place == 2
    clock.now_s += 6  # "gone" last asked 11 s ago, "waiting" 6 s ago
    assert queue.wait_turn(waiting, timeout_s=0), "a silent ticket held the line"
    with pytest.raises(ValueError, match="no longer in the queue"):
        queue.place(gone)


def test_runs_of_a_setup_already_ahead_cost_no_wait():
    """Runs that will be shown an identical run ahead of them (same setup) add nothing to the
    estimate; a live run of that setup (no setup given) still counts; and a run of a setup
    ahead waits only until that run ends, whatever is between."""
    queue = RunQueue(pace=Pace.uniform(1.0, run_s=0.0), clock=Clock(), stale_s=1e9)
    running = queue.join("a", 10, setup="seed")
    assert queue.wait_turn(running, timeout_s=0)
    same = [queue.join(s, 10, setup="seed") for s in "bc"]
    other = queue.join("d", 20, setup="custom")
    live = queue.join("e", 10)
    last = queue.join("f", 5, setup="custom")
    assert [queue.place(t).estimate_s for t in same] == pytest.approx([10.0, 10.0])
    other_place = queue.place(other)
    assert other_place.estimate_s == pytest.approx(10.0), "the seed runs ahead are shown"
    assert not other_place.identical_ahead
    assert queue.place(live).estimate_s == pytest.approx(30.0)
    assert queue.place(last).estimate_s == pytest.approx(30.0), "until the custom run ahead ends"
    assert queue.place(last).identical_ahead
    queue.shown_instead = lambda setup: setup == "custom"  # a custom run just finished
    assert queue.place(last).estimate_s == pytest.approx(10.0), "a custom run counted"
    queue.shown_instead = lambda setup: setup in ("custom", "seed")  # the running one too
    estimate_now_s = queue.place(last).estimate_now_s  # not yet told: within its tolerance
    assert estimate_now_s == pytest.approx(0.0), "a run about to be shown counted"


def test_a_run_of_the_running_setup_waits_only_for_it():
    """The seed running and five other setups waiting before it: a run of the seed is told the
    running run's place and remaining time, and that it will be shown that run (a 30-session room
    told such runs 240 to 300 s for waits of 20 to 80 s, counting the whole queue)."""
    clock = Clock()
    queue = RunQueue(pace=Pace.uniform(1.0, run_s=0.0), clock=clock, stale_s=1e9)
    running = queue.join("a", 40, setup="seed")
    assert queue.wait_turn(running, timeout_s=0)
    for session in "bcdef":
        queue.join(session, 50, setup=session)
    seed = queue.join("g", 40, setup="seed")
    clock.now_s += 15.0
    place = queue.place(seed)
    assert (place.place, place.total) == (1, 6), "not the running run's place among six runs"
    assert place.estimate_s == pytest.approx(25.0) and place.identical_ahead, place


def test_a_ticket_taken_out_ends_its_wait_at_once():
    """Stop takes a waiting run out of the queue (``leave``, from another thread): its handler's
    ``wait_turn`` ends at once, not at the end of its poll, so the page can show it stopped."""
    import time

    queue = RunQueue()
    holder = queue.join("a", 10)
    assert queue.wait_turn(holder, timeout_s=0)
    waiting = queue.join("b", 10)
    timer = threading.Timer(0.1, queue.leave, args=(waiting,))
    timer.start()
    started_s = time.monotonic()
    with pytest.raises(ValueError, match="no longer in the queue"):
        queue.wait_turn(waiting, timeout_s=5.0)
    waited_s = time.monotonic() - started_s
    timer.join()
    assert waited_s < 1.0, f"the wait went on {waited_s:.1f} s after the ticket left"
    assert queue.size() == 1, "the run holding the model was touched"


def test_a_pace_timed_at_start_prices_the_first_waits_and_never_overrides_a_finished_run():
    """``calibrate`` teaches the pace of a run timed at start (as if it finished, rendering at the
    prior), so the first waiting run gets an estimate before any run finished; the first run that
    finishes replaces that pace (a busy start must not skew it), and a later calibration changes
    nothing."""
    queue = RunQueue(stale_s=1e9)
    timed = Work(static_steps=20, continuous_steps=10)
    queue.calibrate(timed, {"static": 4.0, "continuous": 2.0})  # 0.2 s per step in either
    assert queue.measured
    first, second = queue.join("a", Work(static_steps=50, continuous_steps=50)), queue.join("b", 1)
    assert queue.place(second).estimate_s == pytest.approx(100 * 0.2 + queue.pace.run_s)
    assert queue.wait_turn(first, timeout_s=0)
    queue.finish(
        first, wall_s=100 * 0.4 + queue.pace.run_s, parts_s={"static": 20, "continuous": 20}
    )
    taught = queue.pace.s_per_unit()
    assert taught == pytest.approx(0.4), "the first run did not replace the pace timed at start"
    queue.calibrate(timed, {"static": 40.0, "continuous": 20.0})
    assert queue.pace.s_per_unit() == pytest.approx(taught), "a calibration overrode a real run"


def test_the_store_is_read_for_a_waiting_run_once_per_run_ended():
    """Looking at places again and again reads which references are still missing once; after a
    run ended (which may have stored some), the next look reads it again and prices what the
    store now holds."""
    stored, reads = set(), []

    def recheck(references):
        reads.append(1)
        return {key: cap for key, cap in references.items() if key not in stored}

    queue = RunQueue(pace=Pace.uniform(1.0, run_s=0.0), clock=Clock(), stale_s=1e9)
    running = queue.join("a", 10)
    assert queue.wait_turn(running, timeout_s=0)
    refs = {((1, 2, 3), None): 4}
    ahead = queue.join("b", Work(continuous_steps=10, references=refs, recheck=recheck))
    last = queue.join("c", 1)
    first = queue.place(last).estimate_s
    for _ in range(5):
        assert queue.place(last).estimate_s == pytest.approx(first)
    assert len(reads) == 1, f"the store was read {len(reads)} times between two runs"
    stored.add(((1, 2, 3), None))
    queue.finish(running, wall_s=10.0, parts_s={"continuous": 10.0})
    assert queue.place(last).estimate_s < first, "a reference stored meanwhile is still priced"
    assert len(reads) == 2
    assert ahead.missing[1] == {}


def test_a_running_run_slower_than_the_pace_stretches_the_waits_behind_it():
    """Once the running run has done ``MIN_PROGRESS_STEPS`` since its first report, its pace over
    the learned one scales what is left of it and the runs behind it (the load now is the best
    guess of the load then), clipped to ``SLOWDOWN_RANGE``."""
    clock = Clock()
    queue = RunQueue(pace=Pace.uniform(0.1, run_s=0.0), clock=clock, stale_s=1e9)
    running, last = queue.join("a", 100), (queue.join("b", 50), queue.join("c", 1))[1]
    assert queue.wait_turn(running, timeout_s=0)
    assert queue.place(last).estimate_s == pytest.approx(10.0 + 5.0), "at the pace"
    clock.now_s += 0.2
    queue.progress(running, 1)
    clock.now_s += 8.0
    queue.progress(running, 41)  # 0.2 s a step: twice the pace
    assert queue.place(last).estimate_s == pytest.approx(59 * 0.2 + 2 * 5.0)
    clock.now_s += 92.0
    queue.progress(running, 50)  # 2 s a step: clipped to the range's top
    top = SLOWDOWN_RANGE[1]
    assert queue.place(last).estimate_s == pytest.approx(top * 0.1 * 50 + top * 5.0)


def _estimate_behind_a_slow_run(starts: list[bool]) -> float:
    """The wait of the second run behind a 100-step run at twice a 0.1 s pace, 42 steps in;
    ``starts``: whether a server on the host was starting during its first 41 steps, then after.
    """
    clock, starting = Clock(), iter(starts)
    state = {"starting": next(starting)}
    pace = Pace.uniform(0.1, run_s=0.0)
    queue = RunQueue(pace=pace, clock=clock, stale_s=1e9)
    queue.starting = lambda: state["starting"]  # as the page's model sets it
    running, last = queue.join("a", 100), (queue.join("b", 50), queue.join("c", 1))[1]
    assert queue.wait_turn(running, timeout_s=0)
    clock.now_s += 0.2
    queue.progress(running, 1)
    clock.now_s += 8.0
    queue.progress(running, 41)  # 0.2 s a step: twice the pace
    state["starting"] = next(starting)
    clock.now_s += 0.2
    queue.progress(running, 42)
    return queue.place(last).estimate_s


def test_a_run_slowed_beside_a_servers_start_stretches_only_its_own_wait():
    """A running run at twice the pace while a server starts on the host (vLLM compiling on the
    engines' CPUs) has what is left of it stretched, 58 steps at 0.2 s, but not the 50 steps of
    the run behind: they run after the start, at the pace. The start ending during the run
    changes nothing; without a start, both are stretched (the load now is the best guess of the
    load then)."""
    beside_start_s = _estimate_behind_a_slow_run([True, False])
    assert beside_start_s == pytest.approx(58 * 0.2 + 50 * 0.1), "the start's slowdown spread"
    assert _estimate_behind_a_slow_run([False, False]) == pytest.approx(58 * 0.2 + 50 * 0.2)


def test_the_time_before_a_runs_first_step_is_not_its_pace():
    """A run that takes 5 s to start (its job handed over, its first prefill) and then steps at
    the learned pace stretches no wait: the slowdown is timed from its first report of steps."""
    clock = Clock()
    queue = RunQueue(pace=Pace.uniform(0.1, run_s=0.0), clock=clock, stale_s=1e9)
    running, waiting = queue.join("a", 200), queue.join("b", 50)
    assert queue.wait_turn(running, timeout_s=0)
    clock.now_s += 5.0
    queue.progress(running, 1)
    clock.now_s += 4.0
    queue.progress(running, 41)  # 40 steps in 4 s: the learned 0.1 s a step
    assert queue.place(waiting).estimate_s == pytest.approx(159 * 0.1), "its 159 steps left"


def test_an_estimate_counts_no_run_past_the_hosts_run_limit(monkeypatch):
    """Each run ahead counts at most CBP_RUN_TIME_LIMIT_S (the limit stops it there), the running
    one at most what is left of its limit: a huge run ahead adds 60 s, not its hours of work."""
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "0")  # joined with no limit: none is refused
    clock = Clock()
    queue = RunQueue(pace=Pace.uniform(0.5, run_s=0.0), clock=clock, stale_s=1e9)
    running = queue.join("a", 1_000_000)  # 500,000 s of work
    assert queue.wait_turn(running, timeout_s=0)
    huge, small, last = queue.join("b", 2_000_000), queue.join("c", 20), queue.join("d", 20)
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "60")
    clock.now_s += 45  # 15 s left of the running run's limit
    assert queue.place(huge).estimate_s == pytest.approx(15.0), "the running run past its limit"
    assert queue.place(small).estimate_s == pytest.approx(15.0 + 60.0), "a run ahead past 60 s"
    assert queue.place(last).estimate_s == pytest.approx(15.0 + 60.0 + 10.0)
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "0")  # no limit: the work as it is
    assert queue.place(small).estimate_s == pytest.approx(499_955.0 + 1_000_000.0), (
        "without a limit"
    )


def test_identical_runs_count_once_in_places_and_totals():
    """Places and totals count runs, not sessions: a waiting run whose setup is ahead adds no
    place for those behind it and is told the place of the run it will be shown; everyone is
    told the same total."""
    queue = RunQueue(pace=Pace.uniform(1.0, run_s=0.0), clock=Clock(), stale_s=1e9)
    running = queue.join("a", 10, setup="seed")
    assert queue.wait_turn(running, timeout_s=0)
    setups = ["custom", "seed", "seed", "custom", None, "other"]
    waiting = [queue.join(f"s{i}", 10, setup=setup) for i, setup in enumerate(setups)]
    places = [queue.place(t) for t in waiting]
    told = [(p.place, p.total, p.identical_ahead) for p in places]
    assert told == [
        (2, 4, False),
        (1, 4, True),  # shown the running seed run
        (1, 4, True),
        (2, 4, True),  # shown the first custom run
        (3, 4, False),  # run live: a turn of its own
        (4, 4, False),
    ], told
    assert queue.place(running).total == 4 and queue.size() == 7


def test_a_told_estimate_counts_down_and_moves_only_past_its_tolerance():
    """What a waiting run is told counts down from what it was told last while the queue's own
    estimate stays within ``TOLD_TOLERANCE_SHARE`` (at least ``TOLD_TOLERANCE_S``) of it, and
    moves to the queue's estimate once past: an estimate flipping by 30 s is told 80, 70, 60,
    not 80, 50, 60."""
    clock = Clock()
    shown = {"B": False}  # whether run B ahead would be shown a recent run (it then costs nothing)
    queue = RunQueue(
        pace=Pace.uniform(1.0, run_s=0.0),
        clock=clock,
        stale_s=1e9,
        shown_instead=lambda setup: shown.get(setup, False),
    )
    running = queue.join("a", 60)  # 60 s
    assert queue.wait_turn(running, timeout_s=0)
    queue.join("b", 20, setup="B")  # 20 s, or nothing when shown
    mine = queue.join("c", 1)
    told, now = [], []
    for flip in (False, True, False, True, False):
        shown["B"] = flip
        place = queue.place(mine)
        told.append(place.estimate_s)
        now.append(place.estimate_now_s)
        clock.now_s += 10
    assert now == pytest.approx([80, 50, 60, 30, 40]), now
    # 50 is within 30 % of 70 counted down; 30 is past 30 % of 50; 40 is past 10 s from 20
    assert told == pytest.approx([80, 70, 60, 30, 40]), told


def test_a_run_well_over_the_limit_is_refused_before_it_queues(monkeypatch):
    """At a learned pace, a run whose own cost is over ``LIMIT_MARGIN`` times the run limit is
    refused as it joins, with its estimate, the limit and what to change; one between the limit
    and that margin joins (its estimate may be noisy, and the limit stops it)."""
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "60")
    queue = RunQueue(pace=Pace.uniform(1.0, run_s=0.0), clock=Clock(), stale_s=1e9)
    over = 60 * LIMIT_MARGIN + 1
    with pytest.raises(ValueError) as refused:
        queue.join("a", int(over))
    message = str(refused.value)
    assert "estimate here is 2 min" in message and "limit of 60 s" in message, message
    assert "fewer rows" in message and "max_new_tokens" in message, message
    assert queue.size() == 0, "a refused run was queued"
    near = queue.join("a", int(60 * LIMIT_MARGIN) - 1)
    assert queue.place(near).place == 1, "a run near the limit was refused"


def test_a_reference_a_run_ahead_computes_does_not_refuse_a_run():
    """The refusal prices a run's references as the estimate does: one that a run in line
    already computes costs it nothing, and another one is priced."""
    key, other = ((1, 2, 3), None), ((4, 5, 6), None)
    queue = RunQueue(pace=Pace.uniform(1.0, run_s=0.0), clock=Clock(), stale_s=1e9)
    queue.join("a", Work(continuous_steps=1, references={key: 200}))  # no limit set yet
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("CBP_RUN_TIME_LIMIT_S", "60")
        assert queue.join("b", Work(continuous_steps=10, references={key: 200}))
        with pytest.raises(ValueError, match="over 2 times"):
            queue.join("c", Work(continuous_steps=10, references={other: 200}))


def test_no_run_is_refused_without_a_pace_learned_from_a_finished_run(monkeypatch):
    """With no pace, or only the pace timed at start (which a busy start made many times too
    slow), no run is refused; once a run finished here, the same run is."""
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "60")
    queue = RunQueue(stale_s=1e9)
    big = Work(continuous_steps=1000)
    queue.leave(queue.join("a", big))  # no pace at all
    queue.calibrate(Work(continuous_steps=10), {"continuous": 10.0})  # 1 s a step, timed at start
    first = queue.join("a", big)
    assert queue.wait_turn(first, timeout_s=0)
    queue.finish(first, wall_s=10.0, parts_s={"continuous": 10.0})  # a finished run: 10 ms a step
    queue.join("b", 100)  # 1 s here
    with pytest.raises(ValueError, match="estimate here"):
        queue.join("c", Work(continuous_steps=13_000))  # 130 s


def test_a_place_is_counted_after_the_silent_tickets_are_dropped():
    """The look that drops a silent ticket ahead tells a place and total without it."""
    clock = Clock()
    queue = RunQueue(clock=clock, stale_s=10)
    queue.join("gone", 1, setup="x")
    mine = queue.join("mine", 1, setup="y")
    clock.now_s += 11
    place = queue.place(mine)
    assert (place.place, place.total) == (1, 1), place


def test_a_lent_ticket_outlasts_the_polling_bound_but_not_its_own():
    """A ticket whose line Gradio holds (``lend``) is kept past ``stale_s`` while others poll,
    asks again as usual, and only a ticket lent and never asked about for ``lent_stale_s`` goes."""
    clock = Clock()
    queue = RunQueue(clock=clock, stale_s=10, lent_stale_s=100)
    holder, lent, polling = queue.join("holder", 1), queue.join("lent", 1), queue.join("polling", 1)
    assert queue.wait_turn(holder, timeout_s=0)
    queue.lend(lent)
    for _ in range(9):  # 90 s of polls by the ticket behind it
        clock.now_s += 10
        assert not queue.wait_turn(polling, timeout_s=0)
    assert queue.place(lent).place == 2, "a lent ticket was dropped before its bound"
    queue.lend(lent)
    clock.now_s += 101
    assert not queue.wait_turn(polling, timeout_s=0)
    with pytest.raises(ValueError, match="no longer in the queue"):
        queue.place(lent)
