"""The queue's cost model on synthetic hosts: each part's pace learned, the prior sensible, stored
references free, and the sum over a queue within the ±30 % a waiting person is promised."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine.host_queue.run_cost import (
    PREFILL_TOKENS_PER_STEP,
    REFERENCE_STEPS,
    REFERENCE_TOKEN_STEPS,
    Pace,
    Work,
)
from engine.host_queue.run_queue import RunQueue


class Host:
    """A made-up host: its true seconds per static and continuous step, per prompt token, per
    reference set-up and token, and per run (rendering); ``wall_s`` is what a run takes on it."""

    def __init__(self, static_s, continuous_s, prompt_token_s, reference_s, token_s, run_s):
        self.static_s, self.continuous_s, self.prompt_token_s = (
            static_s,
            continuous_s,
            prompt_token_s,
        )
        self.reference_s, self.token_s, self.run_s = reference_s, token_s, run_s

    def parts_s(self, work: Work) -> dict[str, float]:
        """As ``engine.worker.worker_model.pace_parts`` splits a run: steps and prefill apart."""
        return {
            "static": work.static_steps * self.static_s,
            "continuous": work.continuous_steps * self.continuous_s,
            "prefill": 2 * work.prompt_tokens * self.prompt_token_s,
        }

    def wall_s(self, work: Work) -> float:
        refs_s = sum(
            self.reference_s + cap * self.token_s + len(key[0]) * self.prompt_token_s
            for key, cap in work.references.items()
        )
        return sum(self.parts_s(work).values()) + refs_s + self.run_s


def _work(rng: random.Random, stored: bool = False) -> Work:
    """A tour-like run: 4-16 requests, caps 4-300, short or long prompts, references missing."""
    n = rng.randint(4, 16)
    caps = [rng.randint(4, 300) for _ in range(n)]
    prompts = [tuple(range(rng.choice((8, 12, 90, 450)) + i)) for i in range(n)]
    refs = {} if stored else {(p, None): c for p, c in zip(prompts, caps, strict=True)}
    return Work(
        static_steps=sum(caps) // 2,
        continuous_steps=sum(caps) // 3,
        prompt_tokens=sum(len(p) for p in prompts),
        references=refs,
    )


# The 2-core CPU as measured (docs/measurements.md) and a host whose step costs 20x less, while
# its prefill and reference set-up are relatively cheaper still (a GPU-like shape).
CPU = Host(0.13, 0.10, 0.009, 2.0, 0.05, 1.5)
FAST = Host(0.006, 0.005, 0.00005, 0.05, 0.004, 1.5)


@pytest.mark.parametrize("host", [CPU, FAST], ids=["cpu", "fast"])
def test_after_a_few_runs_a_queues_wait_is_within_30_percent(host):
    """After three finished runs on a host, the estimated time of the next five runs (each alone,
    and together as a queue's wait) is within ±30 % of what they take, cold or stored references."""
    rng = random.Random(7)
    pace = Pace()
    for _ in range(3):
        work = _work(rng, stored=rng.random() < 0.5)
        pace.learn(work, host.wall_s(work), host.parts_s(work))
    ahead = [_work(rng, stored=i % 2 == 0) for i in range(5)]
    estimate_s = sum(pace.cost_s(w) for w in ahead)
    actual_s = sum(host.wall_s(w) for w in ahead)
    assert abs(estimate_s / actual_s - 1) <= 0.30, (estimate_s, actual_s)


def test_each_engine_part_learns_its_own_pace():
    """A host whose static steps cost three times its continuous steps: after one run, a run with
    another mix of the two is priced right (one pace for every step would not)."""
    host = Host(0.3, 0.1, 0.0, 0.0, 0.0, 0.0)
    pace = Pace()
    pace.learn(
        Work(static_steps=100, continuous_steps=100), 40.0, {"static": 30.0, "continuous": 10.0}
    )
    mostly_continuous = Work(static_steps=10, continuous_steps=300)
    assert pace.run_s < 1.0, "the run's own time (0 s here) was not learned"
    assert pace.cost_s(mostly_continuous) - pace.run_s == pytest.approx(
        host.wall_s(mostly_continuous)
    )


def test_a_learned_prefill_pace_prices_a_long_prompt_run():
    """A host whose prompt token costs a tenth of a step (not 1 / PREFILL_TOKENS_PER_STEP): after
    one chat-like run with short prompts, a run that is mostly one long system prompt's prefill
    is priced at the host's prefill pace, with the static waves' padding counted."""
    pace = Pace(run_s=0.0)
    chat = Work(static_steps=100, continuous_steps=60, prompt_tokens=50, static_prefill_tokens=90)
    # 0.1 s a step; (90 + 50) prompt positions at 0.01 s each
    pace.learn(chat, 17.4, {"static": 10.0, "continuous": 6.0, "prefill": 1.4})
    assert pace.s_per_unit("prefill") == pytest.approx(0.01)
    policy = Work(
        static_steps=20, continuous_steps=20, prompt_tokens=2000, static_prefill_tokens=2400
    )
    want_s = 40 * 0.1 + (2400 + 2000) * 0.01
    assert pace.cost_s(policy) == pytest.approx(want_s + pace.run_s)
    # the same run with no padding in its waves costs its 400 padded positions less
    unpadded = dataclasses.replace(policy, static_prefill_tokens=2000)
    assert pace.cost_s(policy) - pace.cost_s(unpadded) == pytest.approx(400 * 0.01)


def test_before_a_prefill_was_timed_a_prompt_token_costs_the_prior_share_of_a_step():
    """A pace taught only steps prices each prompt position at 1 / PREFILL_TOKENS_PER_STEP of a
    step, for each engine that prefills it."""
    pace = Pace.uniform(0.2, run_s=0.0)
    prompts = Work(continuous_steps=10, prompt_tokens=300)
    assert pace.cost_s(prompts) == pytest.approx(0.2 * (10 + 300 / PREFILL_TOKENS_PER_STEP))


def test_a_stored_reference_costs_nothing_and_a_missing_one_its_prior_share():
    """Before any reference was computed here, a missing one costs its set-up, prefill and
    tokens in step units at the engines' pace; a stored one costs nothing."""
    pace = Pace.uniform(0.1)
    key = (tuple(range(30)), None)
    missing = Work(continuous_steps=50, references={key: 40})
    stored = Work(continuous_steps=50)
    steps = REFERENCE_STEPS + 30 / PREFILL_TOKENS_PER_STEP + 40 * REFERENCE_TOKEN_STEPS
    assert pace.cost_s(missing) - pace.cost_s(stored) == pytest.approx(0.1 * steps)
    assert pace.cost_s(missing, references={}) == pytest.approx(pace.cost_s(stored))


def test_the_last_arrival_bounds_the_engines_time():
    """A run whose requests arrive over 30 s cannot end its engines sooner, however few steps."""
    pace = Pace.uniform(0.01)
    assert pace.cost_s(Work(continuous_steps=10, min_wall_s=30.0)) >= 30.0


def test_a_reference_a_run_ahead_computes_is_not_counted_again():
    """Two waiting runs need the same missing reference: the second's wait counts it once (in
    the run ahead), not twice; a larger cap than the one ahead is computed again."""
    queue = RunQueue(pace=Pace.uniform(0.1), stale_s=1e9)
    key = (tuple(range(10)), None)
    first = queue.join("a", Work(continuous_steps=100, references={key: 50}))
    second = queue.join("b", Work(continuous_steps=100, references={key: 50}))
    third = queue.join("c", Work(continuous_steps=100, references={key: 80}))
    fourth = queue.join("d", Work(continuous_steps=1))
    with_ref = queue.pace.cost_s(first.work)
    without = queue.pace.cost_s(first.work, references={})
    assert with_ref > without
    assert queue.place(third).estimate_s == pytest.approx(with_ref + without)
    larger = queue.pace.cost_s(third.work)
    assert queue.place(fourth).estimate_s == pytest.approx(with_ref + without + larger)
    assert second.work.references == third.work.references | {key: 50}


def test_a_reference_stored_since_a_run_joined_is_no_longer_counted():
    """A waiting run's references are checked again once a run ended (``recheck``): one stored
    meanwhile (by another setup's run) costs nothing any more."""
    key = (tuple(range(10)), None)
    stored = set()
    recheck = lambda refs: {k: c for k, c in refs.items() if k not in stored}  # noqa: E731
    queue = RunQueue(pace=Pace.uniform(0.1), stale_s=1e9)
    running = queue.join("a", Work(continuous_steps=100))
    assert queue.wait_turn(running, timeout_s=0)
    waiting = queue.join("b", Work(continuous_steps=100, references={key: 50}, recheck=recheck))
    last = queue.join("c", Work(continuous_steps=1))
    assert queue.place(last).estimate_s > queue.pace.cost_s(waiting.work)
    stored.add(key)  # the running run stored it
    queue.finish(running, wall_s=10.0 + queue.pace.run_s, parts_s={"continuous": 10.0})
    after = queue.place(last).estimate_s
    assert after == pytest.approx(queue.pace.cost_s(waiting.work, references={}))
    assert after < queue.pace.cost_s(waiting.work)
