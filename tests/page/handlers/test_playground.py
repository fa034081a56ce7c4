"""The page's handlers as plain functions, on a tiny random model (no weights, no browser)."""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path

import gradio as gr
import pytest
from fake_traces import continuous_trace, static_trace
from page_runs import run_and_render

from engine.kernels import cpu_share
from engine.model.loader import ModelLoadError
from engine.page.handlers import playground
from engine.page.inputs import presets
from engine.page.panels import page_panels
from engine.page.run import run_options, shared_model
from engine.page.run.cpu_split import CpuSplit
from engine.page.run.run_handle import RunHandle
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel
from engine.page.views import run_status, run_view
from engine.trace import DECODE, PREFILL
from engine.worker import worker_model
from engine.workloads.workload import MAX_ROWS, parse_table, seed_specs

ROWS = [["hello world", 5], ["abc", 12], ["the quick brown fox", 3], ["x", 7]]


@pytest.fixture(scope="module")
def result(shared) -> playground.RunResult:
    return run_and_render(ROWS, 2, RunOptions(chat_template=False, check_reference=True), shared)


@pytest.fixture
def no_model(monkeypatch, shared):
    """Make any model call (or model load) fail the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the model was called")

    monkeypatch.setattr(shared.worker.model.runner, "forward_packed", forbidden)
    monkeypatch.setattr(shared.worker.model.runner, "generate", forbidden)
    monkeypatch.setattr(playground, "get_model", forbidden)


def test_a_run_renders_both_engines(result):
    """A run holds both traces, the reference, 2 metrics rows, 1 output row per request."""
    state = result.state
    assert (state.static.engine, state.continuous.engine) == ("static", "continuous")
    assert sorted(state.reference) == [0, 1, 2, 3], f"reference ids {sorted(state.reference)}"
    assert [row[0] for row in result.metrics] == ["static", "continuous"], result.metrics
    assert [row[0] for row in result.outputs] == ["R0", "R1", "R2", "R3"], result.outputs
    assert all(row[-2] == "✓" for row in result.outputs), "outputs differ from model.generate"
    assert "✓ all match" in result.status, result.status
    assert "2 slots" in result.status and "4 requests" in result.status, result.status


def test_default_step_fuses_prefill_and_decode(result):
    """The first shown step is the first continuous step with a prefill next to decodes."""
    step = result.state.continuous.steps[result.step_index]
    assert {s.kind for s in step.seqs} == {PREFILL, DECODE}, f"step {result.step_index} not fused"
    earlier = result.state.continuous.steps[: result.step_index]
    assert all({s.kind for s in st.seqs} != {PREFILL, DECODE} for st in earlier), "not the first"
    assert result.views.packed_mask.layout.title.text.startswith(f"Packed step {result.step_index}")


def test_timelines_share_the_x_scale(result):
    """Both timelines get the same x range: the longer run's end."""
    static_range = list(result.views.static_timeline.layout.xaxis.range)
    continuous_range = list(result.views.continuous_timeline.layout.xaxis.range)
    longest = max(result.state.static.steps[-1].end_s, result.state.continuous.steps[-1].end_s)
    assert static_range == continuous_range == [0, longest], (static_range, continuous_range)


def test_as_outputs_matches_the_wiring(result):
    """``as_outputs`` gives every Run output by name: state, figures, slider, tables, status."""
    out = dict(zip(run_view.RUN_OUTPUTS, result.as_outputs(), strict=True))
    assert out["run_state"] is result.state
    names = [Path(p).name for p in out["downloads_file"]]
    assert names == ["requests.csv", "traces.json", "trace.perfetto.json", "charts.html"], names
    slider = out["step_slider"]
    assert slider.maximum == result.state.num_steps - 1, "slider does not span every step"
    assert slider.value == result.step_index, "slider not at the default step"
    assert out["status_markdown"] == result.status
    metrics = out["metrics_table"]
    assert metrics.value["data"] == result.metrics, "metrics table rows differ"
    assert "outputs match model.generate" in metrics.value["headers"], metrics.value["headers"]
    table = out["outputs_table"]
    assert table.value["data"] == result.outputs, "outputs table rows differ"
    assert table.value["headers"][3:5] == ["static output", "continuous output"]
    for name in ("block_map_plot", "latency_cdf_plot", "step_usage_plot"):
        assert out[name] is not None, f"{name} not drawn"


def test_numbers_as_strings_and_chat_template(shared):
    """Caps typed as strings are accepted, and the chat template changes the prompt tokens."""
    rows = [["hi", "3"], ["yo", "2.0"]]
    plain = run_and_render(rows, 1, RunOptions(chat_template=False, check_reference=False), shared)
    chat = run_and_render(rows, 1, RunOptions(chat_template=True, check_reference=False), shared)
    assert [r.max_new_tokens for r in plain.state.static.requests] == [3, 2]
    assert chat.state.static.requests[0].num_prompt_tokens > 2, "chat template not applied"
    assert plain.state.reference is None and plain.outputs[0][-2] == "—", "reference was run"


@pytest.mark.parametrize(
    ("rows", "slots", "message"),
    [
        ([], 2, "The workload is empty"),
        ([["", 5]], 2, "Row 1: the prompt is blank"),
        ([["hi", "abc"]], 2, "is not a number"),
        ([["hi", 2.5]], 2, "is not a whole number"),
        ([["hi", 0]], 2, "out of range"),
        ([["hi", 5000]], 2, "out of range"),
        ([["hi", 5]] * (MAX_ROWS + 1), 2, "over the limit"),
        ([["hi", 511]], 2, "exceeds the model's context of 512 tokens"),
        ([["hi", 5]], 0, "at least 1"),
        ([["hi", 5]], 1.5, "Slots must be a whole number"),
        ([["hi", 5]], None, "Slots must be a whole number"),
    ],
)
def test_bad_input_raises_gr_error_before_the_model(rows, slots, message, shared, no_model):
    """Bad input raises gr.Error with the engine's message, and no model call happens."""
    with pytest.raises(gr.Error) as caught:
        run_and_render(rows, slots, RunOptions(chat_template=False, check_reference=True), shared)
    assert message in caught.value.message, caught.value.message


def test_gr_error_carries_the_workload_message_verbatim(shared):
    """The page shows exactly the ValueError text of ``engine.workloads.workload``."""
    with pytest.raises(ValueError) as engine_error:
        parse_table([["hi", "abc"]])
    with pytest.raises(gr.Error) as page_error:
        run_and_render(
            [["hi", "abc"]],
            2,
            RunOptions(chat_template=False, check_reference=False),
            shared,
        )
    assert page_error.value.message == str(engine_error.value)


def test_model_load_error_is_told_in_the_status_line(monkeypatch):
    """A model that cannot load is reported in the status line ("Not run"), not as a crash."""

    def failing_load(*args, **kwargs):
        raise ModelLoadError("Cannot find model 'nope'; pass a local folder or hub id.")

    monkeypatch.setattr(shared_model, "_shared_model", None)
    monkeypatch.setattr(worker_model, "load_model", failing_load)
    knobs = (2, False, False, "slots", 0, "decode_first", False, 0, "time")
    (update,) = list(playground.run_event(ROWS, *knobs, replay_recent=False))
    status = update[run_view.RUN_OUTPUTS.index("status_markdown")]
    assert status.startswith("**Not run:**") and "Cannot find model" in status, status


def test_get_model_loads_once(monkeypatch, shared):
    """The shared model is loaded on first use only."""
    calls = []

    def fake_load(*args, **kwargs):
        calls.append(args)
        return shared.worker.model.loaded

    monkeypatch.setattr(shared_model, "_shared_model", None)
    monkeypatch.setattr(worker_model, "load_model", fake_load)
    monkeypatch.setattr(worker_model, "ModelRunner", lambda loaded: shared.worker.model.runner)
    first, second = shared_model.get_model(), shared_model.get_model()
    assert first is second and len(calls) == 1, f"loaded {len(calls)} times"
    assert first.label == "Model: tiny-llama · runs on CPU · float32", first.label


def test_model_line_says_the_kernel_choice_on_hover(shared):
    """The page's model line names "matmul kernels", whose hover text is the runner's own
    summary of its kernel choice, escaped so that no quote in it ends the attribute."""
    line = shared.label_markdown
    summary = shared.worker.model.runner.kernel_summary()
    assert line.startswith(shared.label + " · Llama · 82.2 k parameters · <abbr title="), line
    before, found, _ = line.partition('">matmul kernels</abbr>')
    assert found, line
    assert html.unescape(before.rsplit('title="', 1)[1]) == summary


def test_model_line_says_which_layers_the_step_runs(shared):
    """The model line says "fused layers" with the runner's step summary on hover, for the
    tiny Llama on CPU."""
    line = shared.label_markdown
    before, found, _ = line.partition('">fused layers</abbr>')
    assert found, line
    hover = html.unescape(before.rsplit('title="', 1)[1])
    assert hover == "step: eager, the fused layers", hover


def test_model_line_ends_in_the_peak_rss_with_the_bytes_by_part_on_hover(shared):
    """The model line's last part is the process's peak RSS; its hover, the weights' bytes and
    each kernel's copies (``memory_account``)."""
    line = shared.label_markdown
    hover, shown = line.rsplit('title="', 1)[1].removesuffix("</abbr>").split('">')
    hover = html.unescape(hover)
    assert shown.startswith("peak RSS ") and shown.endswith((" MB", " GB")), line
    assert hover.startswith(shown + "; weights 0 MB, kernels' copies "), hover


def test_update_step_redraws_without_the_model(result, no_model):
    """Moving the step slider redraws cursors and masks from the stored traces only."""
    views = playground.update_step(result.state, 3, "step")
    static_tl, continuous_tl, packed, padded, block_map, *inside = views
    assert len(inside) == 3, "vLLM's inside views are not redrawn with the step"
    for fig in (static_tl, continuous_tl):
        (cursor,) = [s for s in fig.layout.shapes if s.name == "cursor"]
        assert cursor.x0 == 3, f"cursor at {cursor.x0}"
    assert packed.layout.title.text.startswith("Packed step 3"), packed.layout.title.text
    assert "step 3:" in padded.layout.title.text, padded.layout.title.text
    assert static_tl.layout.xaxis.title.text.startswith("step"), "x axis not in steps"
    assert block_map.layout.title.text == "KV block map at step 3", "the block map did not follow"


def test_update_step_clamps_to_the_shorter_run(result, no_model):
    """Past the continuous run's end its mask shows its last step and says so, its cursor sits at
    its end, and the slider's label gives each engine's step range."""
    state = result.state
    num_continuous = len(state.continuous.steps)
    assert num_continuous < state.num_steps, "test needs continuous to take fewer steps"
    _, continuous_tl, packed, *_ = playground.update_step(state, state.num_steps - 1, "time")
    want = f"Packed step {num_continuous - 1}:"
    assert packed.layout.title.text.startswith(want), packed.layout.title.text
    said = f"continuous ran {num_continuous} steps: its last, {num_continuous - 1}, is shown"
    assert packed.layout.title.subtitle.text.startswith(said), packed.layout.title.subtitle.text
    label = run_view.slider_label(state)
    assert f"continuous 0–{num_continuous - 1}" in label, label
    assert f"static steps 0–{len(state.static.steps) - 1}" in label, label
    (cursor,) = [s for s in continuous_tl.layout.shapes if s.name == "cursor"]
    assert cursor.x0 == pytest.approx(state.continuous.wall_s), "cursor not at the run's end"


def test_update_step_before_any_run_changes_nothing():
    """With no run yet, the step slider leaves every figure as it is."""
    skips = (gr.skip(),) * len(run_view.STEP_VIEW_OUTPUTS)
    assert playground.update_step(None, 0, "time") == skips


def test_a_links_step_moves_the_slider_and_the_views_together(result, no_model):
    """After a run, a link's kept step comes back as the slider's value together with the step
    views drawn at that step (one update: the slider never reads a step the views do not show),
    clamped to the run, and the kept step is cleared."""
    state = result.state
    for kept, step in ((3, 3), (10_000, state.num_steps - 1)):
        slider, cleared, *views = playground.link_step_event(state, kept, "step")
        assert (slider, cleared) == (step, None), f"link step {kept}: slider {slider}, {cleared}"
        drawn = playground.update_step(state, step, "step")
        assert [v.to_json() for v in views] == [v.to_json() for v in drawn], f"step {kept}"
    skips = (gr.skip(),) * (2 + len(run_view.STEP_VIEW_OUTPUTS))
    assert playground.link_step_event(state, None, "time") == skips, "moved without a link"
    assert playground.link_step_event(None, 3, "time") == skips, "moved without a run"


def test_only_the_users_moves_of_the_step_slider_redraw_the_step_views():
    """The slider's redraw listens to its ``input`` (the user's moves), not ``change``: a step the
    page sets carries its views (a run's results, ``link_step_event``), and a second redraw
    arriving later could draw another step than the slider reads."""
    import app

    demo = app.build_demo("Model: test")
    (slider,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", "") == "step_slider"]
    events = {e for fn in demo.fns.values() for i, e in fn.targets if i == slider._id}
    assert events == {"input"}, f"the step slider's events: {events}"
    (linked,) = [fn for fn in demo.fns.values() if fn.name == "link_step_event"]
    drawn = {getattr(o, "elem_id", None) for o in linked.outputs}
    assert {"step_slider", "packed_mask_plot"} <= drawn, f"a link's step sets only {drawn}"


def test_status_line_names_mismatches():
    """The status line names the requests whose output differs from the reference."""
    static = static_trace([3, 4], [2, 3], num_slots=2)
    continuous = continuous_trace([3, 4], [2, 3], num_slots=2)
    reference = {r.request_id: list(r.output_token_ids) for r in static.requests}
    reference[1] = [0]
    status = run_status.status_line(run_view.RunState(static, continuous, reference))
    assert "✗ differs" in status and "static: R1" in status and "continuous: R1" in status, status


def test_status_line_gives_steps_beside_the_time_ratio_and_says_times_vary():
    """The status line puts the step counts (which do not move) next to the time ratio (which
    does), and says in one line that wall times on a shared machine vary."""
    static = static_trace([4, 5, 6], [3, 30, 5], num_slots=2)
    continuous = continuous_trace([4, 5, 6], [3, 30, 5], num_slots=2)
    status = run_status.status_line(run_view.RunState(static, continuous, None))
    s, c = len(static.steps), len(continuous.steps)
    assert f"continuous {c} steps against static {s}: {s / c:.2f}× fewer" in status, status
    assert status.endswith(run_status.NOISE_NOTE) and "vary" in run_status.NOISE_NOTE
    assert (
        run_status.steps_comparison(480, 300)
        == "continuous 300 steps against static 480: 1.60× fewer"
    )
    assert run_status.steps_comparison(50, 52).endswith("1.04× more")
    assert run_status.steps_comparison(64, 64).endswith(": the same")


def test_presets_parse_and_article_matches_seed():
    """Every preset is a valid table; the article's preset is the seed workload, no template."""
    by_name = presets.load_presets()
    assert presets.DEFAULT_PRESET in by_name and "One long, many short" in by_name
    for name in by_name:
        rows, _, text = presets.apply_preset(name)
        assert parse_table(rows), f"preset {name!r} does not parse"
        assert len(text) > 80, f"preset {name!r} lacks its explanation"
    rows, chat_template, _ = presets.apply_preset(presets.DEFAULT_PRESET)
    assert parse_table(rows) == seed_specs(), "article preset differs from seed_specs()"
    assert chat_template is False, "seed preset should not use the chat template"


def test_every_preset_states_a_checkable_claim():
    """Each preset names the slots its text speaks of (the text says them) and a claim the
    real-model test checks (tests/page/inputs/test_presets_real.py)."""
    known = {"token_budget", "max_tokens_per_step", "long_requests", "fewer_steps", "min_ratio"}
    known |= {"max_ratio", "continuous_steps", "lower_mean_ttft", "min_prefix_hit_rate"}
    for name, preset in presets.load_presets().items():
        check = preset["check"]
        assert check and set(check) <= known, f"{name}: {sorted(check)}"
        assert 1 <= preset["slots"] <= 16, f"{name}: slots {preset['slots']}"
        assert f"{preset['slots']} slots" in preset["description"], f"{name}: slots not in text"
        assert check.get("fewer_steps") in (None, "static", "continuous", "same"), name
        assert check.get("lower_mean_ttft") in (None, "continuous", "prefix_caching"), name
        if check.get("fewer_steps"):
            bound = "max_ratio" if check["fewer_steps"] == "same" else "min_ratio"
            assert bound in check, f"{name}: no {bound}"
        n = len(presets.apply_preset(name)[0])
        assert all(0 <= int(rid) < n for rid in check.get("long_requests", {})), name
        assert presets.choose_preset(name)[3] == preset["slots"]


def test_app_wiring():
    """app.py wires Run (every handler started; the page's queue serializes them on the model),
    "Run live anyway" to the same handler, and the step views to theirs."""
    import app

    demo = app.build_demo("Model: test")
    by_api = {fn.api_name: fn for fn in demo.fns.values()}
    run = by_api["run"]
    assert run.fn is playground.run_event, "Run wired wrongly"
    wired = [c.elem_id for c in run.outputs[1:]]
    assert wired == list(run_view.RUN_OUTPUTS[1:]), f"Run outputs out of order: {wired}"
    assert [c.elem_id for c in by_api["step"].outputs] == list(run_view.STEP_VIEW_OUTPUTS)
    assert run.concurrency_limit is None, "a run waits in Gradio's queue, not the page's"
    (live,) = [fn for fn in demo.fns.values() if fn.fn is run.fn and fn is not run]
    assert live.concurrency_limit is None and live.api_name != "run"
    assert [c._id for c in live.outputs] == [c._id for c in run.outputs]
    replay = run_options.RUN_INPUTS.index("replay_recent")
    assert (run.inputs[replay].value, live.inputs[replay].value) == (False, False), "API replays"
    (on_load,) = [fn for fn in demo.fns.values() if fn.outputs == [run.inputs[replay]]]
    assert on_load.fn() is True and on_load.targets[0][1] == "load", "the page's Run never replays"
    assert run.show_progress == "full", "a queued user would not see their place in the queue"
    assert run.trigger_mode == "always_last", "a Run pressed while a stopped run ends is lost"
    run_index = next(i for i, fn in demo.fns.items() if fn is run)
    pressed = [fn for fn in demo.fns.values() if fn.fn is playground.run_pressed]
    targets = sorted(map(str, [run.targets, live.targets]))
    assert sorted(str(fn.targets) for fn in pressed) == targets, "Run presses are not noted"
    assert not any(fn.queue for fn in pressed), "a Run press waits in the queue to be noted"
    (stop,) = [fn for fn in demo.fns.values() if fn.fn is playground.stop_event]
    assert not stop.queue, "Stop waits in the queue: it can reach the server after a later Run"
    for fn in [*pressed, stop]:  # issue 27: "once" drops a click while the last one is pending
        assert fn.trigger_mode == "multiple", f"{fn.name}: a quick second click is dropped"
    numbered = [fn for fn in [*pressed, stop] if len(fn.inputs) == 2 and fn.js]
    assert len(numbered) == 3, "a press or Stop lacks its click number (issue 27)"
    (told,) = [fn for fn in demo.fns.values() if fn.fn is playground.stop_told]
    assert told.queue and told.trigger_after == next(
        i for i, fn in demo.fns.items() if fn is stop
    ), "Stop's toast is not queued after Stop"
    stop_cancels = [fn.cancels for fn in demo.fns.values() if fn.targets == stop.targets]
    assert not any(stop_cancels), "Stop cancels the Run event (a cancel waits, and drops Run)"
    (leave,) = [fn for fn in demo.fns.values() if fn.fn is playground.left_queue_event]
    cancels = [fn.cancels for fn in demo.fns.values() if fn.targets == leave.targets]
    live_index = next(i for i, fn in demo.fns.items() if fn is live)
    assert [run_index, live_index] in cancels, "a queued run cannot be taken out of the queue"
    assert [c._id for c in leave.outputs] == [c._id for c in run.outputs], "leaving restores less"
    for name in ("step", "x_axis"):
        assert by_api[name].fn is playground.update_step, f"{name} not wired to update_step"
    assert app.parse_args([]).host == "127.0.0.1" and app.parse_args([]).port == 7860


def test_a_run_press_puts_its_note_in_the_status_line_at_once():
    """Run's press (unqueued, answered before the run's first update) writes the status line
    too: "Run pressed", not the previous run's line, from the moment Run is pressed. Its
    progress shows on the note under Run, so the status line's tracker stays the run's."""
    import app

    demo = app.build_demo("Model: test")
    for press in [fn for fn in demo.fns.values() if fn.fn is playground.run_pressed]:
        written = [c.elem_id for c in press.outputs]
        update = dict(zip(written, playground.run_pressed(RunHandle()), strict=True))
        status = update.get("status_markdown")
        assert status and status.startswith("**Run pressed:**"), (
            f"the status line keeps the previous run's line after a press: {written}"
        )
        tracked = [c.elem_id for c in press.show_progress_on or press.outputs]
        assert "status_markdown" not in tracked, "the press's progress hides the run's tracker"


def test_choosing_a_preset_sets_the_engine_settings_back():
    """The preset dropdown writes the engine settings too, each to the value the page opens
    with: a token budget set for one preset does not carry over to the next."""
    import app

    demo = app.build_demo("Model: test")
    (chosen,) = [fn for fn in demo.fns.values() if fn.fn is presets.choose_preset]
    values = presets.choose_preset("Long-tail mix")
    knobs = {c.elem_id: (c, v) for c, v in zip(chosen.outputs, values)}  # noqa: B905
    for name, default in presets.ENGINE_DEFAULTS.items():
        elem_id = page_panels.COMPONENTS[name].split(".")[-1]
        assert elem_id in knobs, f"choosing a preset leaves {name} as it was"
        component, value = knobs[elem_id]
        assert value == default == component.value, f"{name}: set to {value}, opens at {default}"


def test_engine_knobs_reach_the_engines(shared):
    """KV mode, token budget and the transformers comparison all run and still match generate."""
    options = RunOptions(check_reference=True, kv_mode="concat", token_budget=4, compare_hf=True)
    result = run_and_render(ROWS, 2, options, shared)
    assert result.state.continuous.kv_mode == "concat"
    assert max(sum(s.num_new_tokens for s in st.seqs) for st in result.state.continuous.steps) <= 4
    assert result.state.hf_continuous is not None
    assert "✓ all match" in result.status, result.status
    assert len(result.outputs[0]) == 8, "a third output column for transformers' engine"


def test_poisson_arrivals_reach_both_engines(shared):
    """With an arrival rate, requests arrive over time and nobody is admitted early."""
    options = RunOptions(check_reference=False, arrival_rate_per_s=50.0)
    result = run_and_render(ROWS, 2, options, shared)
    for trace in (result.state.static, result.state.continuous):
        arrivals = [r.arrival_s for r in trace.requests]
        assert arrivals == sorted(arrivals) and arrivals[0] > 0, "Poisson arrivals not applied"
        assert all(r.admit_s >= r.arrival_s for r in trace.requests), trace.engine


def test_paged_kv_knobs_reach_the_engine_and_its_views(shared):
    """Paged mode with a small KV budget preempts, still matches generate, and the page draws the
    block map at each step and the per-step KV blocks."""
    mib = 12 * 4 * shared.worker.model.runner.kv_bytes_per_token() / 2**20  # 12 blocks of 4 tokens
    rows = [["the quick brown fox", 20], ["hello world", 20], ["abc", 20]]
    settings = run_options.RunSettings(
        rows=rows,
        num_slots=3,
        chat_template=False,
        check_reference=True,
        kv_mode="paged",
        token_budget="0",
        policy="decode_first",
        compare_hf=False,
        arrival_rate="0",
        x_axis="time",
        kv_budget_mib=str(mib),
        block_size="4",
    )
    options = run_options.options_from_page(settings)
    result = run_and_render(rows, 3, options, shared)
    trace = result.state.continuous
    assert trace.kv_mode == "paged" and trace.info["kv_blocks"] == 12
    assert trace.metrics().num_preemptions > 0, "12 blocks of 4 cannot hold three of these"
    assert "✓ all match" in result.status, result.status
    step = max(trace.steps, key=lambda s: s.kv_blocks_used)
    block_map = playground.update_step(result.state, step.index, "step")[4]
    assert f"{step.kv_blocks_used}/12 blocks" in block_map.layout.title.subtitle.text
    usage = next(t for t in result.step_usage.data if t.name == "KV blocks in use")
    assert list(usage.y) == [s.kv_blocks_used for s in trace.steps]


def test_model_line_names_the_engine_process_kernels_and_the_cpu_split(shared):
    """With the engines in their own process, the kernels named are that process's, and the
    CPUs split between it and the page are said in a few words, with the CPUs on hover."""
    kernels = "matmul: skinny at 1 row (the engine process's)"
    facts = dataclasses.replace(shared.facts, kernels=kernels)
    line = PageModel(facts=facts, cpu_split=CpuSplit(engine=(1,), page=(0,))).label_markdown
    assert 'title="matmul: skinny at 1 row (the engine process&#x27;s)"' in line, line
    assert line.endswith(
        ' · <abbr title="Engines on CPU 1 (1 thread), the page on CPU 0">'
        "engines on 1 of 2 CPUs</abbr>"
    ), line


def test_a_run_taken_under_load_is_marked_in_the_status_line():
    """An engine whose run shared its CPUs with other work over the bound (0.45 of them) gets a
    ⚠ line naming the share; one at 0.05 gets none."""
    static = static_trace([4, 5], [3, 4], num_slots=2)
    continuous = continuous_trace([4, 5], [3, 4], num_slots=2)
    for trace, share in ((static, 0.45), (continuous, 0.05)):
        trace.warnings += cpu_share.load_warning(trace.engine, share)
    status = run_status.status_line(run_view.RunState(static, continuous, None))
    assert "⚠ static ran while other work took 45% of its CPUs" in status, status
    assert "taken under load" in status and "⚠ continuous" not in status, status
