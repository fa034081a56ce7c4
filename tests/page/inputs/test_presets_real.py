"""Every preset on the embedded model does what its explanation says.

Each preset in ``assets/presets.json`` has the slot count its text speaks of (``slots``) and a
``check``: a token budget the text asks for, and what the text claims: which requests are long and
how long they really get (they must not stop at end-of-sequence early), which engine needs fewer
steps and by at least how much (or that both need about the same), that continuous batching takes
as many steps as its longest request, that no step passes the token budget, or that continuous
batching serves the first tokens sooner, or that prefix caching hits often enough and serves them
sooner with it (the continuous engine then runs again with the toggle on). Step counts are
compared, not wall times, except for the TTFT claims, whose gaps are large: steps do not depend
on how busy the machine is. The engines run for real (no reference check, to save time).
"""

from __future__ import annotations

import pytest

from engine.batching.continuous import ContinuousEngine
from engine.page.handlers import playground
from engine.page.inputs import presets
from engine.page.run.run_options import RunOptions, prepare
from engine.page.run.shared_model import PageModel, local_model
from engine.worker.worker_model import WorkerModel

pytestmark = pytest.mark.real_model
PRESETS = presets.load_presets()


@pytest.fixture(scope="module")
def model(embedded_model) -> PageModel:
    return local_model(WorkerModel.from_loaded(embedded_model))


def _run(model: PageModel, name: str):
    check = PRESETS[name]["check"]
    rows, chat_template, _, num_slots, *_ = presets.choose_preset(name)
    options = RunOptions(
        chat_template=chat_template,
        check_reference=False,
        kv_mode="paged",
        token_budget=check.get("token_budget"),
    )
    requests, config = prepare(model, rows, num_slots, options)
    return check, playground.run_engines(model, requests, config, options)


def _check_prefix_caching(model: PageModel, name: str, check: dict, without) -> None:
    """The toggle on (the continuous engine again; the static engine never shares): the hit rate
    the text promises, the same outputs, lower mean TTFT."""
    rows, chat_template, _, num_slots, *_ = presets.choose_preset(name)
    options = RunOptions(chat_template=chat_template, kv_mode="paged", prefix_caching=True)
    requests, config = prepare(model, rows, num_slots, options)
    with model.lock:
        cached = ContinuousEngine(model.worker.model.runner, config).run(requests)
    plain = without.continuous
    hit_rate = cached.metrics().prefix_cache_hit_rate
    print(f"{name}: prefix-cache hit rate {hit_rate:.2f}")
    assert hit_rate >= check["min_prefix_hit_rate"], f"{name}: hit rate {hit_rate:.2f}"
    assert without.static.metrics().prefix_cache_hit_rate == 0, "the static engine shared blocks"
    for a, b in zip(cached.requests, plain.requests, strict=True):
        assert a.output_token_ids == b.output_token_ids, f"{name}: R{a.request_id} changed"
    saved = _prefilled_tokens(plain) - _prefilled_tokens(cached)
    assert saved == cached.num_prefix_cached_tokens() > 0, f"{name}: {saved} tokens not prefilled"
    if check.get("lower_mean_ttft") == "prefix_caching":
        on, off = cached.metrics().mean_ttft_s, plain.metrics().mean_ttft_s
        print(f"{name}: mean TTFT {off:.3f} s without prefix caching, {on:.3f} s with")
        assert on < off, f"{name}: mean TTFT {on:.3f} s with prefix caching, {off:.3f} without"


def _prefilled_tokens(trace) -> int:
    return sum(s.num_new_tokens for step in trace.steps for s in step.seqs if s.kind == "prefill")


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_does_what_its_text_says(model, name):
    """The long request is long, and the step counts go the way the explanation says."""
    check, state = _run(model, name)
    static_steps, continuous_steps = len(state.static.steps), len(state.continuous.steps)
    print(f"{name}: static {static_steps} steps, continuous {continuous_steps}")
    for rid, min_tokens in check.get("long_requests", {}).items():
        got = len(state.continuous.requests[int(rid)].output_token_ids)
        assert got >= min_tokens, f"{name}: R{rid} stops after {got} tokens, not >= {min_tokens}"
    fewer = check.get("fewer_steps")
    if fewer == "same":
        ratio = max(static_steps, continuous_steps) / min(static_steps, continuous_steps)
        assert ratio <= check["max_ratio"], f"{name}: {static_steps} against {continuous_steps}"
    elif fewer is not None:
        more = static_steps if fewer == "continuous" else continuous_steps
        less = continuous_steps if fewer == "continuous" else static_steps
        assert more >= check["min_ratio"] * less, (
            f"{name}: {fewer} should need {check['min_ratio']}× fewer steps: static "
            f"{static_steps}, continuous {continuous_steps}"
        )
    if check.get("continuous_steps") == "longest":
        longest = max(len(r.output_token_ids) for r in state.continuous.requests)
        assert continuous_steps == longest, f"{name}: {continuous_steps} steps, longest {longest}"
    if "max_tokens_per_step" in check:
        most = max(s.num_scheduled_tokens for s in state.continuous.steps)
        assert most <= check["max_tokens_per_step"], f"{name}: a step carried {most} tokens"
    if "min_prefix_hit_rate" in check:
        _check_prefix_caching(model, name, check, state)
    if check.get("lower_mean_ttft") == "continuous":
        static_ttft = state.static.metrics().mean_ttft_s
        continuous_ttft = state.continuous.metrics().mean_ttft_s
        assert continuous_ttft < static_ttft, f"{name}: TTFT {continuous_ttft} vs {static_ttft}"
