"""The shipped recording: it loads, every view renders from it, and re-recording works."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from engine.page.handlers import recording
from engine.page.inputs import page_io, presets
from engine.page.run import shared_model
from engine.page.views import run_status, run_view
from tools import record_run

MAX_RECORDING_BYTES = 250_000  # compact JSON: the page sends it to every visitor


@pytest.fixture(scope="module")
def shipped() -> run_view.RunState:
    return recording.load_recording()


def test_shipped_recording_is_the_default_preset_labelled_with_where_and_when(shipped):
    """The recording is the default preset at the default slots, on the paged KV cache, labelled
    with device, dtype, date and an invitation to press Run; it is small."""
    meta = shipped.recorded
    rows, _, _ = presets.apply_preset(presets.DEFAULT_PRESET)
    assert [r.prompt for r in shipped.static.requests] == [row[0] for row in rows]
    assert [r.max_new_tokens for r in shipped.continuous.requests] == [row[1] for row in rows]
    assert shipped.static.num_slots == page_io.DEFAULT_SLOTS == meta.num_slots
    assert shipped.continuous.kv_mode == "paged" and shipped.continuous.info["kv_blocks"] > 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", meta.date), meta.date
    label = meta.label()
    for part in (meta.device_label, meta.date, "press Run to measure it here", "Recorded run"):
        assert part in label, f"{part!r} missing from {label!r}"
    assert " · " in meta.device_label, f"no dtype in {meta.device_label!r}"
    size = recording.RECORDING_PATH.stat().st_size
    assert size < MAX_RECORDING_BYTES, f"the recording is {size} bytes"


def test_shipped_recording_matched_the_reference(shipped):
    """Both engines' outputs in the recording equal the recorded model.generate reference."""
    assert shipped.reference is not None
    for trace in (shipped.static, shipped.continuous):
        got = {r.request_id: r.output_token_ids for r in trace.requests}
        assert got == shipped.reference, f"{trace.engine} differs from the reference"


def test_every_view_renders_from_the_recording(shipped):
    """Render gives every figure, both tables and a status naming the recording; the step views
    draw at the first, the default and past the last step."""
    result = run_view.render(shipped, downloads=False)
    assert result.status.startswith("**Recorded run**"), result.status
    assert "steps against" in result.status and run_status.NOISE_NOTE in result.status
    assert len(result.metrics) == 2 and len(result.outputs) == len(shipped.static.requests)
    assert result.latency_cdf is not None and result.step_usage is not None
    for step in (0, result.step_index, shipped.num_steps - 1, shipped.num_steps + 5):
        views = run_view.step_views(shipped, step, "step")
        assert all(fig is not None for fig in views.as_tuple()), f"a view is missing at {step}"
    outputs = dict(zip(run_view.RUN_OUTPUTS, result.as_outputs(), strict=True))
    assert outputs["step_slider"].maximum == shipped.num_steps - 1


def test_record_writes_a_recording_the_page_opens_on(shared, monkeypatch, tmp_path):
    """``make record``'s function runs the default preset (here on the tiny model) and writes a
    file that loads and renders."""
    monkeypatch.setattr(shared_model, "load_shared_model", lambda **kwargs: shared)
    monkeypatch.setattr(
        presets, "apply_preset", lambda name: ([["hello world", 3], ["abc", 5]], False, "")
    )
    path = record_run.record(tmp_path / "run.json")
    state = recording.load_recording(path)
    assert state.recorded.preset == presets.DEFAULT_PRESET and state.reference is not None
    assert [len(r.output_token_ids) for r in state.continuous.requests] == [3, 5]
    assert run_view.render(state, downloads=False).status.startswith("**Recorded run**")
    assert recording.opening_result(tmp_path / "missing.json") is None


def test_the_page_opens_on_the_recording(shipped):
    """build_demo's run state and figures start from the recording (never empty frames)."""
    import gradio as gr

    import app

    demo = app.build_demo("Model: test")
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    unpicked = ("downloads_file", "divergence_dropdown")  # no files; no verdicts recorded to pick
    unpicked += ("inside_column",)  # a layout block, shown or hidden: it has no value
    for elem_id in run_view.RUN_OUTPUTS[1:]:
        if elem_id not in unpicked:
            assert by_id[elem_id].value is not None, f"{elem_id} opens empty"
    states = [b for b in demo.blocks.values() if isinstance(b, gr.State)]
    assert any(isinstance(s.value, run_view.RunState) for s in states), "no recorded run state"


def test_a_page_on_another_model_opens_empty_with_a_hint_to_press_run():
    """On a model other than the recorded one (a .gguf path), the page opens as it does without
    a recording: no run state, empty charts, and a status line saying to press Run and why the
    recording is not shown; on the embedded model, named in any case, the recording shows."""
    import gradio as gr

    import app
    from engine.page.inputs.link_query import Precision

    gguf = Precision(model="/tmp/g270/gemma-3-270m-q4_k_m.gguf")
    demo = app.build_demo("Model: gemma", precision=gguf)
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    status = by_id["status_markdown"].value
    assert status.startswith("Press Run") and "embedded model only" in status, status
    assert "\n" not in status and "Recorded run" not in status, status
    assert by_id["continuous_timeline_plot"].value is None, "the recorded timeline is shown"
    states = [b.value for b in demo.blocks.values() if isinstance(b, gr.State)]
    assert not any(isinstance(s, run_view.RunState) for s in states), "a recorded run state"
    assert recording.opening_result(model_id=" Embedded ") is not None
    assert recording.opening_status("embedded") is None


def test_label_says_when_the_machine_was_busy(shipped):
    """A recording made while the machine ran more threads than it has cores says so."""
    quiet = dataclasses.replace(shipped.recorded, load_average=1.2, num_cpus=2)
    busy = dataclasses.replace(shipped.recorded, load_average=16.5, num_cpus=2)
    assert "busy" not in quiet.label()
    assert "on a busy machine (load average 16 on 2 cores" in busy.label(), busy.label()


def test_label_says_when_the_engines_had_cpus_of_their_own(shipped):
    """A recording made on the engines' CPUs (``make record`` beside a split page) says so, since
    its wall times are those of fewer CPUs than the machine has."""
    split = dataclasses.replace(
        shipped.recorded, machine="2-core AMD EPYC", num_cpus=2, engine_threads=1
    )
    assert "(2-core AMD EPYC, engines on 1 of 2 CPUs, " in split.label(), split.label()
    whole = dataclasses.replace(shipped.recorded, engine_threads=None)
    assert "engines on" not in whole.label()


WHERE = (
    "import os, torch\n"
    "from tools.record_run import keep_to_engine_cpus\n"
    "from engine.worker.engine_thread import ENGINE_THREAD\n"
    "split = keep_to_engine_cpus(os.environ)\n"
    "threads = ENGINE_THREAD.call(torch.get_num_threads)\n"
    "print(split is not None, sorted(os.sched_getaffinity(0)), threads)"
)


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and two CPUs",
)
@pytest.mark.parametrize(
    ("setting", "split"),
    [({}, True), ({"CBP_ENGINE_CPUS": "all"}, False), ({"CBP_ENGINE_PROCESS": "off"}, False)],
)
def test_a_recording_runs_where_the_pages_engines_run(setting, split):
    """``make record`` keeps to the engine CPUs with a torch thread each, as the engine process
    does, unless the page would not split them; in a process of its own, since it pins it."""
    cpus = sorted(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CBP_ENGINE_")} | setting
    done = subprocess.run(
        [sys.executable, "-c", WHERE], env=env, capture_output=True, text=True, check=True
    )
    if split:
        assert done.stdout.split() == ["True", f"[{cpus[-1]}]", "1"], done.stdout
    else:
        assert done.stdout.startswith(f"False {cpus}"), done.stdout
