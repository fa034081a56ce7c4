"""The page's precision: the dtype setting, batch-invariant mode, verdicts and the divergence view,
on the tiny random model (no weights, no browser)."""

from __future__ import annotations

import dataclasses

import gradio as gr
import pytest
import torch
from page_runs import run_and_render
from tiny_model import ByteTokenizer, make_requests, tiny_runner

from engine.fidelity.divergence import RoundingModel, judge, judge_runs
from engine.fidelity.reference import ReferenceCache
from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel, local_model
from engine.page.views import divergence_view, run_status, run_view, tables
from engine.token_logits import TokenLogits
from engine.trace import Trace, new_request_records
from engine.worker import worker_model
from engine.worker.worker_model import WorkerModel

ROWS = [["hello world", 6], ["abc", 9], ["the quick brown fox", 4]]
BF16 = RoundingModel(2.0**-8, 576)


@pytest.fixture(scope="module")
def shared() -> PageModel:
    """A tiny shared model of this module's own (its bfloat16 variant is kept between tests)."""
    runner = tiny_runner()
    return local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))


def _run(shared, **options) -> playground.RunResult:
    return run_and_render(ROWS, 2, RunOptions(**options), shared)


def _run_event_args(dtype, previous=None):
    """``run_event``'s arguments in app.py's order, the precision after the handle and servers."""
    knobs = (False, True, "paged", 0, "decode_first", False, 0, "time")
    return (ROWS, 2, *knobs, previous, "0", "16", False, None, None, dtype, False)


def test_bfloat16_runs_on_a_bfloat16_copy_loaded_once_and_says_so(shared):
    """A bfloat16 run uses the model in bfloat16 (loaded once, same lock), the status line and
    the state name the dtype, and the float32 model is left as it was."""
    result = _run(shared, dtype="bfloat16")
    variant = shared.in_dtype("bfloat16")
    assert shared.in_dtype("bfloat16") is variant, "the bfloat16 model was loaded again"
    assert variant.lock is shared.lock, "a bfloat16 run could overlap a float32 one"
    held = shared.worker.model
    assert next(held.in_dtype("bfloat16").loaded.model.parameters()).dtype == torch.bfloat16
    assert next(held.loaded.model.parameters()).dtype == torch.float32, "the float32 model moved"
    assert result.state.dtype == "bfloat16" and result.status.startswith("**bfloat16** · ")
    assert variant.loaded.device_label == "CPU · bfloat16", variant.loaded.device_label
    assert shared.in_dtype(None) is shared and shared.in_dtype("float32") is shared


def test_float16_on_the_cpu_is_refused_naming_both_and_nothing_is_lost(shared, monkeypatch):
    """float16 on a CPU: "Not run", naming float16 and the CPU, no model loaded or called, and
    the previous run's results stay."""
    previous = _run(shared).state
    monkeypatch.setattr(shared_model, "_shared_model", shared)
    monkeypatch.setattr(shared.worker.model.runner, "forward_packed", pytest.fail)
    with pytest.warns(UserWarning, match="float16"):
        updates = list(playground.run_event(*_run_event_args("float16", previous)))
    assert len(updates) == 1, "a refused run streamed more than its reason"
    shown = dict(zip(run_view.RUN_OUTPUTS, updates[0], strict=True))
    status = shown.pop("status_markdown")
    assert status.startswith("**Not run:** float16 is offered on CUDA only"), status
    assert shown.pop("run_note_markdown").startswith("**Not run:** float16"), "Run's note kept"
    assert "CPU" in status and status.endswith(run_status.status_line(previous)), status
    assert all(v == gr.skip() for v in shown.values()), "a refused dtype changed the results"
    assert "float16" not in shared.variants, "a refused dtype was loaded"


def test_a_dtype_the_device_cannot_run_is_refused_before_any_load(monkeypatch):
    """When the device check refuses a dtype (bfloat16 on a pre-Ampere GPU, say), its message
    reaches the user and no weights are loaded or converted."""
    runner = tiny_runner()
    loads = []
    held = WorkerModel(runner.loaded, runner, ReferenceCache(runner), loader=loads.append)
    model = local_model(held)
    old_gpu = "bfloat16 is not supported on CUDA (Tesla T4): compute capability 7.5"

    def refuse(device, dtype):
        raise ValueError(old_gpu)

    monkeypatch.setattr(worker_model, "check_dtype_supported", refuse)
    with pytest.raises(gr.Error, match="compute capability 7.5"):
        run_and_render(ROWS, 2, RunOptions(dtype="bfloat16"), model)
    assert not loads and not model.variants, "weights were loaded for a refused dtype"
    with pytest.raises(ValueError, match="Unknown dtype"):
        model.in_dtype("float8")


def test_batch_invariant_outputs_equal_their_solo_runs_bitwise(shared):
    """In batch-invariant mode both engines are compared with each request run alone, and every
    output matches it with bitwise-equal logits; the status line and the table say so."""
    result = _run(shared, batch_invariant=True)
    state = result.state
    assert state.batch_invariant and state.continuous.info["batch_invariant"] is True
    entries = [e for v in state.verdicts.values() for e in v.values()]
    assert len(entries) == 2 * len(ROWS) and all(e["verdict"] == "match" for e in entries)
    assert all(e["logits_equal"] for e in entries), "an invariant run's logits were not bitwise"
    assert "batch-invariant mode" in result.status, result.status
    assert (
        "✓ all match each request run alone (batch-invariant) token for token, logits bitwise "
        "equal" in result.status
    ), result.status
    shown = dict(zip(run_view.RUN_OUTPUTS, result.as_outputs(), strict=True))
    assert "matches its solo run" in shown["outputs_table"].headers
    metrics_headers = shown["metrics_table"].headers
    assert "outputs match their runs alone" in metrics_headers, metrics_headers
    assert "outputs match model.generate" not in metrics_headers, metrics_headers


def test_transformers_engine_in_invariant_mode_is_said_to_be_outside_our_control(shared):
    """With transformers' engine and the toggle on, the settings note and the status line say
    the mode does not reach it; with the toggle off there is no note."""
    assert "outside our control" in divergence_view.settings_note(True, True)
    assert "outside our control" not in divergence_view.settings_note(False, True)
    assert divergence_view.settings_note(True, False) == ""
    result = _run(shared, batch_invariant=True, compare_hf=True)
    assert divergence_view.HF_OUTSIDE in result.status, result.status
    assert result.state.hf_continuous.info.get("batch_invariant") is not True


def _logits(pairs):
    ids, values = zip(*pairs, strict=True)
    return TokenLogits(ids, values, (70.0,) * len(ids), 48.0, "d")


class _HandMade:
    """A reference whose verdicts are made by hand: the continuous engine's R0 is a near-tie."""

    def verdicts(self, requests, trace):
        common = [_logits([(5, 30.0), (6, 20.0)])] * 2
        ref_run = [*common, _logits([(9, 20.0), (12, 19.875), (7, 15.0)])]
        eng_run = [*common, _logits([(12, 20.0), (9, 19.9375), (7, 15.5)])]
        found = {1: judge(1, [8], [8], None, None, BF16)}
        output = trace.request(0).output_token_ids
        found[0] = judge(0, output, [5, 7, 9], ref_run, eng_run, BF16)
        return found


def _judged() -> dict:
    requests = make_requests([("ab", 3), ("cd", 1)])
    traces = {}
    for name, output in (("static", [5, 7, 9]), ("continuous", [5, 7, 12])):
        trace = Trace(engine=name, num_slots=2)
        trace.requests = new_request_records(requests)
        trace.requests[0].output_token_ids, trace.requests[1].output_token_ids = output, [8]
        traces[name] = trace
    runner = type("Runner", (), {"tokenizer": ByteTokenizer()})()
    return traces, judge_runs(runner, _HandMade(), requests, traces)


def test_a_near_tie_shows_per_engine_in_the_table_and_status_and_opens_its_view():
    """A hand-made near-tie at token 2: ≈ per engine in the outputs table, counted in the
    status, one pick in the view with the common prefix, both tokens and both runs' top 5."""
    traces, verdicts = _judged()
    rows = tables.outputs_rows(traces, {0: [5, 7, 9], 1: [8]}, verdicts)
    at = tables.outputs_headers(list(traces)).index("matches model.generate")
    assert rows[0][at] == "static ✓ · continuous ≈ near-tie at token 2", rows[0]
    assert rows[1][at] == "✓", rows[1]
    summary = divergence_view.verdict_summary(verdicts, "`model.generate`")
    assert summary.startswith("against `model.generate`: static 2 ✓ 0 ≈ 0 ✗ · continuous 1 ✓ 1 ≈")
    assert divergence_view.engine_symbol(verdicts["continuous"]) == "≈"
    picks = divergence_view.choices(verdicts)
    assert picks == [("R0 · continuous · ≈ near-tie at token 2", "continuous:0")], picks
    markdown, text, top = divergence_view.view(verdicts, "continuous:0", "bfloat16")
    assert "split at token 2" in markdown and "Rounding bound in bfloat16" in markdown, markdown
    assert "logit of the reference's token 20, of the engine's token 19.88" in markdown, markdown
    assert text == (
        "Common prefix (2 tokens):\n5 7\n\nReference's next token: '9'\nEngine's next token: '12'"
    ), text
    assert top[0] == ["'9' ← chosen by reference", "1", "20", "2", "19.94"], top
    assert top[1] == ["'12' ← chosen by engine", "2", "19.88", "1", "20"], top
    assert top[2] == ["'7'", "3", "15", "3", "15.5"], top


def test_a_near_tie_is_explained_in_plain_words_where_it_is_shown():
    """Where a near-tie verdict is shown (the status line's counts and its divergence view) one
    sentence a class can read says what a near-tie is and that it is not a bug (issue 51, item
    10): a bfloat16 run whose every output is ≈ otherwise reads like a page of failures."""
    _, verdicts = _judged()
    summary = divergence_view.verdict_summary(verdicts, "`model.generate`")
    markdown, _, _ = divergence_view.view(verdicts, "continuous:0", "bfloat16")
    for where, shown in (("status line", summary), ("divergence view", markdown)):
        for words in (
            "picked different tokens whose logits were within the rounding margin",
            "the batch's shape changes the order of the float additions",
            "not a bug",
        ):
            assert words in shown, f"the {where} does not say {words!r}: {shown}"


def test_the_divergence_dropdown_redraws_its_pick_and_copes_with_no_run():
    """The dropdown's handler shows the pick; without a run, or without a check, it says so."""
    _, verdicts = _judged()
    state = run_view.RunState(None, None, {}, verdicts=verdicts, dtype="bfloat16")
    assert divergence_view.divergence_event(state, "continuous:0")[1].startswith("Common prefix")
    assert divergence_view.divergence_event(None, None) == (divergence_view.NOT_CHECKED, "", [])
    unchecked = run_view.RunState(None, None, None)
    assert divergence_view.divergence_event(unchecked, None)[0] == divergence_view.NOT_CHECKED
    matched = {"static": {0: {"verdict": "match", "label": "✓"}}}
    assert divergence_view.view(matched, None, None)[0] == divergence_view.NO_DIFFERENCE


def test_app_wires_the_precision_settings_and_the_divergence_view():
    """The dtype dropdown and the toggle reach run_event after the handle (the API's earlier
    inputs keep their places); the dropdown offers float32 and bfloat16 on a CPU."""
    import app

    demo = app.build_demo("Model: test")
    run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    ids = [c.elem_id for c in run.inputs]
    after_servers = ids[ids.index("servers_checkbox") + 1 :][:2]
    assert after_servers == ["dtype_dropdown", "batch_invariant_checkbox"], ids
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    assert [c[1] for c in by_id["dtype_dropdown"].choices] == ["float32", "bfloat16"]
    picks = [fn for fn in demo.fns.values() if fn.fn is divergence_view.divergence_event]
    assert len(picks) == 1 and [c.elem_id for c in picks[0].outputs] == [
        "divergence_markdown",
        "divergence_textbox",
        "divergence_table",
    ]


def _as_server(trace: Trace, served_dtype: str, run_dtype: str) -> Trace:
    """``trace`` as the page's vLLM hands it back: a server's info, with the dtype it ran in."""
    server = {"same_model": True, "dtype": served_dtype, "run_dtype": run_dtype}
    return dataclasses.replace(trace, engine="vllm", info={**trace.info, "server": server})


def test_a_server_in_another_precision_is_not_compared_and_both_panels_agree(shared):
    """A bfloat16 batch-invariant run beside a float32 server: the server's outputs (here a real
    float32 run's, which split from the bfloat16 reference) are "not compared" in the outputs
    table, the status line says no "✗ differs" for it, and "Where outputs differ" names it as not
    compared instead of saying every output matched; a server in the run's own precision that
    differs is named as differing by both panels."""
    state = _run(shared, dtype="bfloat16", batch_invariant=True, check_reference=True).state
    float32 = _run(shared, check_reference=False).state.continuous
    split = [
        r.request_id
        for r in float32.requests
        if r.output_token_ids != state.reference[r.request_id]
    ]
    assert split, "the float32 outputs equal the bfloat16 reference: nothing to check here"
    state.servers = {"vllm": _as_server(float32, "float32", "bfloat16")}
    status = run_status.status_line(state)
    assert "✗ differs" not in status, f"a float32 server judged against bfloat16: {status}"
    rows = tables.outputs_rows(state.traces(), state.reference, state.verdicts)
    for row in rows:
        assert "vllm: float32, not bfloat16: not compared" in row[-2], f"verdict cell: {row[-2]}"
    _, _, markdown, _, _ = divergence_view.first_view(state, run_status.servers_note(state))
    assert "**vllm**: float32, not bfloat16: not compared" in markdown, markdown
    assert divergence_view.NO_DIFFERENCE not in markdown, f"says every output matched: {markdown}"

    state.servers = {"vllm": _as_server(float32, "bfloat16", "bfloat16")}
    status = run_status.status_line(state)
    wanted = ", ".join(f"R{r}" for r in split)
    assert f"servers: ✗ differs (vllm: {wanted})" in status, status
    _, _, markdown, _, _ = divergence_view.first_view(state, run_status.servers_note(state))
    assert f"**vllm** differs from the reference at {wanted}" in markdown, markdown
