"""The engine process: a run there gives the thread's tokens and schedule, streams its progress,
stops within a step, and a killed worker fails one run only.

One worker per module (spawn and a tiny model load cost seconds): its model is
``tiny_worker_model``'s, with the continuous engine's forward pass slowed (``SLOW_STEP_S``) so
that a run can be watched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gradio as gr
import pytest
from tiny_model import SLOW_STEP_S, make_requests, tiny_process_worker, tiny_shared

from engine.config import EngineConfig
from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.cpu_split import engine_process_wanted
from engine.page.run.run import Ended, Run, RunRequest
from engine.page.run.run_handle import RunHandle
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel
from engine.page.views.run_view import RUN_OUTPUTS
from engine.serving.run_control import RunCancelled, RunControl, RunTimedOut

SPECS = [("hello world", 4), ("abc", 30), ("the quick brown fox", 3), ("x", 12)]
CONFIG = EngineConfig(num_slots=2)
CHECKED = RunOptions(chat_template=False, check_reference=True)
STEP_BOUND_S = 3.0  # a stop must end the run within a step: generous for a shared machine
STATUS_INDEX = RUN_OUTPUTS.index("status_markdown")


@pytest.fixture(scope="module")
def process():
    """One engine process on the slowed tiny model for the module; ended afterwards."""
    yield from tiny_process_worker("slow")


@pytest.fixture(scope="module")
def in_process(process):
    """The page's model whose runs go to ``process`` (``PageModel``: no weights here)."""
    model = PageModel.connect(process)
    return model


def _schedule(trace) -> list[list[tuple]]:
    """Each step's (request, kind, new tokens) triples: what a schedule decides."""
    return [[(s.request_id, s.kind, s.num_new_tokens) for s in step.seqs] for step in trace.steps]


def _tokens(trace) -> list[list[int]]:
    return [list(r.output_token_ids) for r in trace.requests]


def raises_value_error(_model, message: str, _watch):
    """A job that fails as bad input does (module level: the worker imports it by name)."""
    raise ValueError(message)


def _run(model) -> Run:
    """A run of SPECS on ``model`` as the page makes it (its time limit from the host's)."""
    handle = RunHandle()
    request = RunRequest(model, make_requests(SPECS), CONFIG, CHECKED, replay=False)
    return Run(request, handle, handle.start())


def _ended(run: Run, timeout_s: float) -> Ended | None:
    """The run's end within ``timeout_s``, else None."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if isinstance(event := run.wait(0.02), Ended):
            return event
    return None


def _await(run: Run, engine: str, timeout_s: float = 60.0) -> dict:
    """Wait until ``engine`` shows a trace with a step; its progress then."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        event = run.wait(0.02)
        assert not isinstance(event, Ended), f"the run ended before {engine} was seen: {event}"
        seen = getattr(event, "progress", {})
        if engine in seen and seen[engine].trace is not None and seen[engine].trace.steps:
            return seen
    raise AssertionError(f"no progress of {engine} within {timeout_s} s")


def test_a_run_in_the_process_gives_the_threads_tokens_and_schedule(in_process):
    """Static and continuous tokens and schedules match the thread's, and generate's outputs."""
    requests = make_requests(SPECS)
    here = playground.run_engines(tiny_shared(), requests, CONFIG, CHECKED)
    there = playground.run_engines(in_process, requests, CONFIG, CHECKED)
    for name in ("static", "continuous"):
        mine, theirs = getattr(here, name), getattr(there, name)
        assert _tokens(theirs) == _tokens(mine), f"{name}: tokens differ from the thread's"
        assert _schedule(theirs) == _schedule(mine), f"{name}: schedule differs from the thread's"
        reference = [list(there.reference[r.request_id]) for r in theirs.requests]
        assert _tokens(theirs) == reference, f"{name}: not generate's tokens"
    assert there.dtype == "float32" and there.verdicts, "no verdicts came back"


def test_progress_arrives_while_it_runs_and_stop_ends_it_within_a_step(in_process):
    """Snapshots of the continuous trace reach the page mid-run; Stop ends the run in a step."""
    with _run(in_process) as run:
        seen = _await(run, "continuous")
        assert seen["static"].num_finished == len(SPECS), "static's last snapshot did not come"
        stopped_s = time.monotonic()
        run.stop()
        ended = _ended(run, STEP_BOUND_S)
        assert ended is not None, f"still running {STEP_BOUND_S} s after Stop"
        took_s = time.monotonic() - stopped_s
    with pytest.raises(RunCancelled):
        ended.result()
    assert took_s < STEP_BOUND_S, f"Stop took {took_s:.2f} s (a step is {SLOW_STEP_S} s)"


def test_the_time_limit_reaches_the_worker(in_process, monkeypatch):
    """A run past its time limit ends with RunTimedOut, its message naming the limit."""
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "0.3")
    with _run(in_process) as run:
        ended = _ended(run, 30)
    assert ended is not None, "the time limit did not end the run"
    with pytest.raises(RunTimedOut, match="limit of 0.3 s"):
        ended.result()


MAIN_LIKE_APP = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import gradio  # as app.py does before it starts the engine process
from tiny_model import tiny_worker_model, worker_modules
from engine.worker.worker_process import ModelSpec, ProcessWorker
from engine.serving.run_control import RunControl
if __name__ == "__main__":
    jobs = ("engine.worker.comparison", "engine.worker.model_facts")  # launch's preload
    process = ProcessWorker(ModelSpec(load=tiny_worker_model, preload=jobs))
    names = process.run(worker_modules, (), RunControl(), lambda *a, **k: None)
    process.close()
    page = [n for n in names if n == "engine.page" or n.startswith("engine.page.")]
    print("ui:", *[n for n in names if n.split(".")[0] in ("gradio", "plotly")], *page)
"""


def test_the_worker_of_a_page_script_loads_no_ui_library_and_no_page_module(tmp_path):
    """Started from a main script that imports gradio (as ``app.py`` does), the worker, its
    model loaded and the page's jobs preloaded, loads neither gradio nor plotly (spawn does not
    run the page's script again there) nor any ``engine.page`` module: it imports the core
    only (``engine.worker.worker_process``)."""
    tests = Path(__file__).resolve().parents[2]
    script = tmp_path / "main_like_app.py"
    script.write_text(MAIN_LIKE_APP.format(root=str(tests.parent), tests=str(tests)), "utf-8")
    command = [sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ui:" in done.stdout, done.stdout
    ui = done.stdout.split("ui:", 1)[1].split()
    assert not ui, f"the engine process loaded UI or page modules: {ui[:10]}"


def test_bad_input_crosses_as_the_same_error(process):
    """A ValueError raised in the worker reaches the page with its type and message."""
    with pytest.raises(ValueError, match="^too many slots for this cache$"):
        process.run(raises_value_error, ("too many slots for this cache",), RunControl(), None)


def test_a_killed_worker_fails_its_run_in_the_status_line_and_the_next_run_works(
    in_process, process, monkeypatch
):
    """SIGKILL mid-run: the page says so in its status line and a toast, not a traceback; the
    next run starts a fresh worker and finishes."""
    monkeypatch.setattr(shared_model, "_shared_model", in_process)
    monkeypatch.setattr(playground, "PROGRESS_INTERVAL_S", 0.05)
    rows = [[prompt, cap] for prompt, cap in SPECS]
    events = playground.run_event(
        rows, 2, False, False, "slots", 0, "decode_first", False, 0, "time"
    )
    killed_pid = process.pid
    for update in events:
        if "continuous batching:" in str(update[STATUS_INDEX]):
            os.kill(killed_pid, signal.SIGKILL)
            break
    shown = []
    with pytest.raises(gr.Error, match="Run stopped: the engine process ended") as raised:
        shown.extend(events)
    last = shown[-1] if shown else None
    assert "killed (SIGKILL" in str(raised.value), str(raised.value)
    assert last is not None and "**Stopped:** the engine process ended" in last[STATUS_INDEX]
    requests = make_requests(SPECS[:2])
    state = playground.run_engines(in_process, requests, CONFIG, CHECKED)
    assert process.pid not in (None, killed_pid), "no fresh worker was started"
    assert len(state.continuous.requests) == 2, "the run after the kill did not finish"


@pytest.mark.parametrize(
    ("value", "on_zerogpu", "wanted"),
    [
        ("", False, True),
        ("", True, False),
        ("auto", False, True),
        ("auto", True, False),
        ("on", True, True),
        ("OFF", False, False),
    ],
)
def test_the_setting_chooses_the_process(value, on_zerogpu, wanted):
    """CBP_ENGINE_PROCESS: auto by default, which is on except on ZeroGPU; on and off say so."""
    environ = {"CBP_ENGINE_PROCESS": value}
    assert engine_process_wanted(environ, on_zerogpu) is wanted, (value, on_zerogpu)


def test_a_bad_setting_is_refused_by_name():
    """Another value raises ValueError naming the variable and the choices."""
    with pytest.raises(ValueError, match="CBP_ENGINE_PROCESS='yes': give auto, on or off"):
        engine_process_wanted({"CBP_ENGINE_PROCESS": "yes"})
