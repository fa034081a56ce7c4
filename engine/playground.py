"""The page's handlers as plain functions: run both engines, then redraw a step without the model.

``app.py`` only lays out components and wires them to these functions, so everything the page does
can be tested without a browser. ``run_comparison`` runs the static and the continuous engine (and,
if asked, the per-request ``model.generate`` reference) on the same tokenized requests and renders
every output; ``update_step`` redraws the heatmaps and timeline cursors from the stored traces.

Bad input raises ``gr.Error`` carrying the engine's ``ValueError`` message: Gradio shows it and
leaves the previous results on the page. The loaded model is the one shared module-level object
(``get_model``), loaded once; tests pass their own ``SharedModel`` instead.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from engine import export, figures, presets, progress_view, tables
from engine.allowlist import check_model_allowed
from engine.config import EngineConfig
from engine.continuous import ContinuousEngine
from engine.hf_continuous import HFContinuousEngine
from engine.live_run import LiveRun
from engine.loader import LoadedModel, load_model
from engine.model_runner import ModelRunner
from engine.reference import ReferenceCache, mismatches
from engine.run_control import RunControl, RunStopped, run_time_limit_s
from engine.sequence import Request
from engine.static import StaticEngine
from engine.trace import DECODE, PREFILL, Trace
from engine.workload import parse_table, poisson_arrivals, tokenize_requests

REQUEST_HEADERS = ["prompt", "max_new_tokens", "arrival_s"]
PROGRESS_INTERVAL_S = 0.5  # at most two progress reports a second
CHART_HEADINGS = ("Static timeline", "Continuous timeline", "Packed mask", "Static mask")


@dataclass
class SharedModel:
    """The loaded model with its runner and reference cache, shared by every run of the page."""

    loaded: LoadedModel
    runner: ModelRunner
    reference: ReferenceCache
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the one running run

    @classmethod
    def from_loaded(cls, loaded: LoadedModel) -> SharedModel:
        runner = ModelRunner(loaded)
        return cls(loaded, runner, ReferenceCache(runner))

    @property
    def label(self) -> str:
        """The page's model line, e.g. "Model: SmolLM2-135M-Instruct · runs on CPU · float32"."""
        return f"Model: {self.loaded.name} · runs on {self.loaded.device_label}"

    def warm_up(self) -> None:
        """Run both engines once on two tiny requests, so one-time costs never reach a timing."""
        specs = parse_table([["Warm-up", 2], ["Warm up again", 3]])
        requests = tokenize_requests(
            specs, self.loaded.tokenizer, chat_template=False, max_context=self.loaded.max_context
        )
        config = EngineConfig(num_slots=2)
        StaticEngine(self.runner, config).run(requests)
        ContinuousEngine(self.runner, config).run(requests)


_shared_model: SharedModel | None = None  # the one lazily loaded shared model (see house style)


def load_shared_model(
    model: str | None = None, device: str | None = None, dtype: str | None = None
) -> SharedModel:
    """Load the model (``engine.loader.load_model`` arguments) and make it the shared one.

    Raises:
        ModelLoadError: the model is not on ``CBP_MODEL_ALLOWLIST`` (checked first), or fails to
            load (see ``load_model``).
    """
    global _shared_model
    check_model_allowed(model)
    _shared_model = SharedModel.from_loaded(load_model(model, device, dtype))
    _shared_model.warm_up()
    return _shared_model


def get_model() -> SharedModel:
    """The shared model, loading the default one on first use."""
    return _shared_model if _shared_model is not None else load_shared_model()


# --- state and results ---------------------------------------------------------------------------


@dataclass
class RunState:
    """What the page keeps between events (in a ``gr.State``): the two traces and the reference."""

    static: Trace
    continuous: Trace
    reference: dict[int, list[int]] | None
    hf_continuous: Trace | None = None  # transformers' own continuous batching, when compared

    def traces(self) -> dict[str, Trace]:
        """The runs in display order, by engine name."""
        runs = {"static": self.static, "continuous": self.continuous}
        if self.hf_continuous is not None:
            runs["hf_continuous"] = self.hf_continuous
        return runs

    @property
    def num_steps(self) -> int:
        """Steps of the longer run: the step slider's range."""
        return max(len(self.static.steps), len(self.continuous.steps))


@dataclass
class StepViews:
    """The four figures that depend on the selected step (plotly figures, or None)."""

    static_timeline: Any
    continuous_timeline: Any
    packed_mask: Any
    static_mask: Any

    def as_tuple(self) -> tuple:
        return self.static_timeline, self.continuous_timeline, self.packed_mask, self.static_mask


@dataclass
class RunResult:
    """Everything one Run renders."""

    state: RunState
    step_index: int
    views: StepViews
    metrics: list[list]
    outputs: list[list]
    status: str
    downloads: list[str] | None = None  # file paths: CSV, whole-trace JSON, Perfetto trace

    def as_outputs(self) -> tuple:
        """Values in the order app.py wires them: state, 4 figures, slider, 2 tables, status."""
        slider = gr.Slider(
            minimum=0, maximum=max(self.state.num_steps - 1, 1), value=self.step_index
        )
        outputs = progress_view.outputs_table(self.outputs, list(self.state.traces()))
        views = self.views.as_tuple()
        return (self.state, *views, slider, self.metrics, outputs, self.status, self.downloads)


# --- handlers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """The page's engine knobs, beside the table and the slot count."""

    chat_template: bool = False
    check_reference: bool = True
    kv_mode: str = "slots"
    token_budget: int | None = None  # None: no limit
    policy: str = "decode_first"
    compare_hf: bool = False
    arrival_rate_per_s: float | None = None  # None: the table's arrival_s (0 when blank)
    arrival_seed: int = 0


def run_comparison(
    rows,
    num_slots,
    options: RunOptions,
    progress=gr.Progress(),  # noqa: B008  (Gradio injects its tracker through this default)
    x_axis: str = "time",
    model: SharedModel | None = None,
) -> RunResult:
    """Run static and continuous batching (and optionally transformers' own) and render results.

    Raises:
        gr.Error: with the engine's message, on a bad table, slot count, knob or model load.
    """
    model = model or _user_errors(get_model)
    requests, config = _user_errors(lambda: _prepare(model, rows, num_slots, options))
    return render(run_engines(model, requests, config, options, progress), x_axis)


def run_engines(
    model: SharedModel,
    requests: list[Request],
    config: EngineConfig,
    options: RunOptions,
    progress,
    watch: Callable[..., None] | None = None,
) -> RunState:
    """Run every engine (and the reference) on ``requests``, one after the other.

    ``watch(engine, trace)`` is called after every step of every engine (``trace`` is None for
    the reference and transformers' engine) and ``watch(engine, trace, done=True)`` after each
    engine's last; an exception it raises (``RunStopped``) ends the run within one step. The
    model's lock is held throughout, so runs never overlap on the model.
    """
    watch = watch or (lambda _engine, _trace, done=False: None)
    runner = model.runner
    with model.lock:
        static = StaticEngine(runner, EngineConfig(config.num_slots)).run(
            requests, _on_step(progress, "static", _static_steps(requests, config), watch)
        )
        watch("static", static, done=True)
        continuous = ContinuousEngine(runner, config).run(
            requests, _on_step(progress, "continuous", _continuous_steps(requests, config), watch)
        )
        watch("continuous", continuous, done=True)
        hf = None
        if options.compare_hf:  # transformers' manager has no step hook: checked before only
            watch("hf_continuous", None)
            progress(None, desc="transformers' continuous batching")
            hf = HFContinuousEngine(runner, config).run(requests)
        reference = None
        if options.check_reference:
            reference = model.reference.outputs(
                requests, _reference_counter(progress), lambda: watch("reference", None)
            )
    return RunState(static, continuous, reference, hf)


def render(
    state: RunState, x_axis: str = "time", status: str | None = None, downloads: bool = True
) -> RunResult:
    """Everything the page shows for a finished run, at its default step; files if ``downloads``."""
    step_index = default_step(state.continuous)
    return RunResult(
        state=state,
        step_index=step_index,
        views=step_views(state, step_index, x_axis),
        metrics=tables.metrics_rows(state.traces(), _reference_ok(state)),
        outputs=tables.outputs_rows(state.traces(), state.reference),
        status=status or status_line(state),
        downloads=write_downloads(state) if downloads else None,
    )


def write_downloads(state: RunState) -> list[str]:
    """The run's exports in a fresh temporary folder: requests.csv, traces.json, Perfetto JSON,
    and charts.html (the four charts at the default step, interactive, offline)."""
    folder = Path(tempfile.mkdtemp(prefix="cbp-run-"))
    paths = export.write_files(folder, state.traces())
    views = step_views(state, default_step(state.continuous), "time")
    charts = dict(zip(CHART_HEADINGS, views.as_tuple(), strict=True))
    charts_path = folder / "charts.html"
    charts_path.write_text(
        export.charts_html({k: v for k, v in charts.items() if v is not None}), encoding="utf-8"
    )
    return [str(path) for path in [*paths, charts_path]]


def run_event(
    rows,
    num_slots,
    chat_template,
    check_reference,
    kv_mode,
    token_budget,
    policy,
    compare_hf,
    arrival_rate,
    x_axis,
    previous: RunState | None = None,
) -> Iterator[tuple]:
    """The Run button's handler: a generator streaming progress, then the finished results.

    Yields the tuple app.py's outputs expect: live updates every ``PROGRESS_INTERVAL_S`` while the
    engines run in a worker thread (``LiveRun``), then ``RunResult.as_outputs()``. When Gradio
    closes the generator (Stop, closed tab) the worker stops within one step.

    Raises:
        gr.Error: bad input (before anything runs, or a ``ValueError`` from an engine), or the
            run passed ``CBP_RUN_TIME_LIMIT_S``; mid-run, after putting the ``previous`` run's
            results back on the page.
    """
    options = _user_errors(
        lambda: _run_options(
            chat_template, check_reference, kv_mode, token_budget, policy, compare_hf, arrival_rate
        )
    )
    model = _user_errors(get_model)
    requests, config = _user_errors(lambda: _prepare(model, rows, num_slots, options))
    control = RunControl(_user_errors(run_time_limit_s))
    started_s = time.monotonic()

    def work(watch: Callable) -> RunState:  # the status line shows progress, not a Gradio bar
        return run_engines(model, requests, config, options, lambda *a, **k: None, watch)

    with LiveRun(work, control) as live:
        while not live.wait(PROGRESS_INTERVAL_S):
            elapsed_s = time.monotonic() - started_s
            yield progress_view.live_outputs(
                live.progress(), requests, config.num_slots, x_axis, elapsed_s, control.time_limit_s
            )
    try:
        state = live.result()
    except (RunStopped, ValueError) as exc:  # stopped, or bad input only the engines could see
        yield _stopped_outputs(previous, f"**Stopped:** {exc}", x_axis)
        raise gr.Error(f"Run stopped: {exc}", print_exception=False) from None
    yield render(state, x_axis).as_outputs()


def stop_event(previous: RunState | None, x_axis: str) -> tuple:
    """The Stop button's handler (it also cancels the Run event): previous results, "stopped"."""
    return _stopped_outputs(previous, "**Stopped** before the end.", x_axis)


def _stopped_outputs(previous: RunState | None, message: str, x_axis: str) -> tuple:
    shown = None if previous is None else render(previous, x_axis, downloads=False)
    return progress_view.stopped_outputs(shown, message)


def _run_options(
    chat_template, check_reference, kv_mode, token_budget, policy, compare_hf, arrival_rate
) -> RunOptions:
    """The page's knobs as ``RunOptions``. Raises ValueError for a bad budget or rate."""
    return RunOptions(
        chat_template=bool(chat_template),
        check_reference=bool(check_reference),
        kv_mode=kv_mode or "slots",
        token_budget=_optional_whole_number(token_budget, "Token budget"),
        policy=policy or "decode_first",
        compare_hf=bool(compare_hf),
        arrival_rate_per_s=_arrival_rate(arrival_rate),
    )


def from_link(request: gr.Request):
    """Preset the page from its link: ``?preset=SLUG&slots=N`` (unknown values are ignored).

    Returns updates for the preset dropdown, request table, chat checkbox, preset text and slots.
    """
    params = dict(request.query_params) if request is not None else {}
    name = presets.by_slug(params.get("preset", ""))
    updates = [gr.skip()] * 5
    if name is not None:
        rows, chat_template, text = presets.apply_preset(name)
        updates[:4] = [name, rows, chat_template, text]
    slots = params.get("slots", "")
    if slots.isdigit() and 1 <= int(slots) <= 16:
        updates[4] = int(slots)
    return tuple(updates)


def update_step(state: RunState | None, step_index, x_axis: str) -> tuple:
    """Redraw the heatmaps and timeline cursors at a step from the stored traces (no model call)."""
    if state is None:
        return (gr.skip(),) * 4
    return step_views(state, int(step_index or 0), x_axis).as_tuple()


def step_views(state: RunState, step_index: int, x_axis: str) -> StepViews:
    """Both timelines on one x scale, cursor at ``step_index``, and both masks at that step."""
    x_max = max(figures.x_extent(state.static, x_axis), figures.x_extent(state.continuous, x_axis))
    return StepViews(
        static_timeline=figures.timeline_figure(state.static, x_axis, x_max, step_index),
        continuous_timeline=figures.timeline_figure(state.continuous, x_axis, x_max, step_index),
        packed_mask=_at_step(figures.mask_heatmap, state.continuous, step_index),
        static_mask=_at_step(figures.static_mask_heatmap, state.static, step_index),
    )


def default_step(trace: Trace) -> int:
    """The first step that fuses a prefill with decodes (the article's point), else step 0."""
    for i, step in enumerate(trace.steps):
        kinds = {s.kind for s in step.seqs}
        if PREFILL in kinds and DECODE in kinds:
            return i
    return 0


def status_line(state: RunState) -> str:
    """One Markdown line: wall times, speedup and the reference verdict."""
    s, c = state.static, state.continuous
    speedup = s.wall_s / c.wall_s if c.wall_s > 0 else math.nan
    line = (
        f"{_count(len(s.requests), 'request')} · {_count(s.num_slots, 'slot')} · "
        f"static {s.wall_s:.2f} s · "
        f"continuous {c.wall_s:.2f} s · **speedup {speedup:.2f}×** (static time / continuous)"
    )
    if state.hf_continuous is not None:
        line += f" · transformers' continuous batching {state.hf_continuous.wall_s:.2f} s"
    if state.reference is None:
        return line + " · outputs not checked against `model.generate`"
    bad = {name: _mismatched(t, state.reference) for name, t in state.traces().items()}
    if not any(bad.values()):
        return line + " · ✓ all match `model.generate` token for token"
    wrong = "; ".join(f"{n}: {', '.join(f'R{r}' for r in ids)}" for n, ids in bad.items() if ids)
    return line + f" · ✗ differs from `model.generate` ({wrong})"


# --- helpers -------------------------------------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _user_errors(fn: Callable):
    """Call ``fn``; turn a ``ValueError`` (bad user input) into a ``gr.Error`` with its message."""
    try:
        return fn()
    except ValueError as exc:
        raise gr.Error(str(exc), print_exception=False) from exc


def _prepare(model: SharedModel, rows, num_slots, options: RunOptions):
    """Validate and tokenize the table, and build the continuous engine's config.

    Raises:
        ValueError: bad table, slot count or knob.
    """
    if hasattr(rows, "values") and hasattr(rows, "columns"):  # a pandas DataFrame
        rows = rows.values.tolist()
    config = EngineConfig(
        num_slots=_whole_number(num_slots, "Slots"),
        kv_mode=options.kv_mode,
        max_num_batched_tokens=options.token_budget,
        scheduling_policy=options.policy,
    )
    specs = parse_table(rows)
    if options.arrival_rate_per_s:
        specs = poisson_arrivals(specs, options.arrival_rate_per_s, options.arrival_seed)
    requests = tokenize_requests(
        specs,
        model.loaded.tokenizer,
        chat_template=options.chat_template,
        max_context=model.loaded.max_context,
    )
    return requests, config


def _whole_number(value, what: str) -> int:
    """A slider or number value -> int. Raises ValueError if it is missing or fractional."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a whole number (got {value!r}).") from None
    if not number.is_integer():
        raise ValueError(f"{what} must be a whole number (got {value!r}).")
    return int(number)


def _optional_whole_number(value, what: str) -> int | None:
    """Empty or 0 means "no limit" (None); otherwise a whole number. Raises ValueError."""
    if value is None or str(value).strip() in ("", "0"):
        return None
    return _whole_number(value, what)


def _arrival_rate(value) -> float | None:
    """Requests per second for Poisson arrivals; empty or 0 means all arrive at t = 0."""
    if value is None or str(value).strip() in ("", "0"):
        return None
    try:
        rate = float(value)
    except ValueError:
        raise ValueError(f"Arrival rate {value!r} is not a number.") from None
    if not rate > 0:
        raise ValueError(f"Arrival rate must be positive, or 0 for all at once (got {value}).")
    return rate


def _static_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated static steps: each wave runs to its longest cap."""
    b = config.num_slots
    return sum(
        max(r.max_new_tokens for r in requests[i : i + b]) for i in range(0, len(requests), b)
    )


def _continuous_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated continuous steps: all tokens spread over the slots, at least the longest cap."""
    caps = [r.max_new_tokens for r in requests]
    return max(math.ceil(sum(caps) / config.num_slots), max(caps))


def _on_step(progress, engine: str, total: int, watch: Callable) -> Callable:
    """An engine's ``on_step``: report progress, then let ``watch`` see the trace (or stop)."""
    count = _step_counter(progress, f"{engine} batching", total)

    def on_step(trace, step) -> None:
        count(trace, step)
        watch(engine, trace)

    return on_step


def _step_counter(progress, desc: str, total: int) -> Callable:
    """An engine ``on_step`` callback reporting ``(done, total)`` steps to Gradio's progress.

    Reports are at least ``PROGRESS_INTERVAL_S`` apart: a browser redrawing the bar every step
    competes for the CPU with the engines it is timing.
    """
    done, last_s = 0, -math.inf

    def on_step(_trace, _step) -> None:
        nonlocal done, last_s
        done += 1
        if time.perf_counter() - last_s >= PROGRESS_INTERVAL_S:
            last_s = time.perf_counter()
            progress((done, max(total, done)), desc=desc)

    return on_step


def _reference_counter(progress) -> Callable:
    """A ``ReferenceCache.outputs`` callback reporting requests done."""

    def on_request(done: int, total: int) -> None:
        progress((done, total), desc="model.generate reference")

    return on_request


def _at_step(builder: Callable, trace: Trace, step_index: int):
    """``builder(trace, step)``, the step clamped to the run's last (None if it has no steps)."""
    if not trace.steps:
        return None
    return builder(trace, min(max(step_index, 0), len(trace.steps) - 1))


def _mismatched(trace: Trace, reference: dict[int, list[int]]) -> list[int]:
    return mismatches({r.request_id: r.output_token_ids for r in trace.requests}, reference)


def _reference_ok(state: RunState) -> dict[str, bool] | None:
    if state.reference is None:
        return None
    return {name: not _mismatched(t, state.reference) for name, t in state.traces().items()}
