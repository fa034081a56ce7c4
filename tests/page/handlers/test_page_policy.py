"""The page's scheduling policy choice: vLLM's policy beside the other two, each with its hover
text, and a Run with it schedules as the engines' ``--policy vllm`` does."""

from __future__ import annotations

from page_runs import run_and_render

from engine.batching.continuous import ContinuousEngine
from engine.page.panels import settings_panel
from engine.page.run.run_options import RunSettings, options_from_page, prepare

ROWS = [["hello world", 6], ["abc", 9], ["a b c d e f g", 4]]


def test_the_policy_choice_offers_vllm_after_the_other_two():
    """The radio offers decode first, prefill first (their /run values unchanged) and then vLLM's
    order ("vllm"); every choice has a hover text."""
    import app

    demo = app.build_demo("Model: test")
    (radio,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "policy_radio"]
    values = [value for _, value in radio.choices]
    assert values == ["decode_first", "prefill_first", "vllm"], f"policy values: {values}"
    labels = [label for label, _ in radio.choices]
    assert set(labels) == set(settings_panel.POLICY_HELP), "a policy lacks its hover text"
    assert radio.value == "decode_first", "the page no longer opens on decode first"


def test_a_run_with_vllms_policy_schedules_as_the_engine_does(shared):
    """Run with "vllm" builds the continuous engine's config with vLLM's policy, and its steps are
    the engine's own under that policy (a token budget makes the policies differ)."""
    fields = dict(rows=ROWS, num_slots=2, chat_template=False, check_reference=False)
    knobs = dict(kv_mode="paged", token_budget=4, policy="vllm", compare_hf=False)
    settings = RunSettings(**fields, **knobs, arrival_rate=0, x_axis="step")
    options = options_from_page(settings)
    assert options.policy == "vllm", f"the page's choice parsed as {options.policy!r}"
    requests, config = prepare(shared, ROWS, 2, options)
    assert config.scheduling_policy == "vllm", "the engine's config lost vLLM's policy"
    state = run_and_render(ROWS, 2, options, shared).state
    direct = ContinuousEngine(shared.worker.model.runner, config).run(requests)
    page_steps = [
        [(s.request_id, s.num_new_tokens) for s in st.seqs] for st in state.continuous.steps
    ]
    engine_steps = [[(s.request_id, s.num_new_tokens) for s in st.seqs] for st in direct.steps]
    assert page_steps == engine_steps, "the page's run did not schedule as --policy vllm does"
