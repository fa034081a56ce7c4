"""One Run, one object: a pressed Run from its place in the queue to its answer.

Shaped as ``engine.worker.comparison``: a ``RunRequest`` in, progress (``Waiting``, ``Running``)
and an end (``Replay``, ``Left``, ``Ended``) out, polled through ``Run.wait``. The whole path,
stage by stage: docs/architecture.md, "One Run, module by module".
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.host_queue.run_cost import run_work, server_part
from engine.host_queue.run_queue import Place
from engine.host_servers import server_runs, server_set
from engine.page.run.recent_runs import RecentRun
from engine.page.run.run_handle import RunHandle, Turn
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel, untaken
from engine.sequence import Request
from engine.serving.run_control import RunControl, RunStopped, run_time_limit_s
from engine.trace import Trace
from engine.worker.comparison import (
    ComparisonJob,
    ComparisonResult,
    JudgeJob,
    judge_in_worker,
    work_in_worker,
)
from engine.worker.progress import EngineProgress
from engine.worker.transport import Job, ThreadWorker
from engine.worker.worker_model import pace_parts

QUEUED_ENGINES = ("static", "continuous")  # the engines whose steps the queue's ``Work`` counts
SHOW = "show"  # a stage: the answer so far goes to the page before the next server starts


@dataclass(frozen=True)
class RunRequest:
    """``requests`` on ``model`` under ``config``; ``replay``: a recent identical run may show."""

    model: PageModel
    requests: list[Request]
    config: EngineConfig
    options: RunOptions
    replay: bool = True
    judged: Callable[[Trace], bool] = lambda _trace: True

    def setup_key(self) -> tuple:
        """What makes two runs identical: model, precision, tokenized requests, every knob."""
        rows = tuple(
            (tuple(r.prompt_token_ids), r.max_new_tokens, r.arrival_s, repr(r.sampling))
            for r in self.requests
        )
        knobs = repr(dataclasses.replace(self.options, dtype=None, model=None))
        model = (self.model.model_id, self.model.label, self.model.dtype_name)
        return (*model, repr(self.config), knobs, rows)


@dataclass
class RunAnswer:
    """A finished run: engines' result, servers' traces, failures, stage seconds, verdicts."""

    comparison: ComparisonResult
    servers: dict[str, Trace] = field(default_factory=dict)
    server_failures: dict[str, str] = field(default_factory=dict)
    server_stages_s: dict[str, float] = field(default_factory=dict)
    server_verdicts: dict[str, dict[int, dict]] | None = None

    def so_far(self) -> RunAnswer:
        return dataclasses.replace(
            self, servers=dict(self.servers), server_failures=dict(self.server_failures)
        )


@dataclass(frozen=True)
class Waiting:
    place: Place


@dataclass(frozen=True)
class Running:
    """Each engine's progress; ``shown``: the answer so far, to show now."""

    progress: dict[str, EngineProgress]
    elapsed_s: float
    time_limit_s: float | None
    shown: RunAnswer | None = None


@dataclass(frozen=True)
class Replay:
    recent: RecentRun


@dataclass(frozen=True)
class Left:
    """Stop took the run out of the queue before it started."""


@dataclass(frozen=True)
class Ended:
    answer: RunAnswer | None
    error: BaseException | None = None

    def result(self) -> RunAnswer:
        """Raises RunStopped (Stop, a closed tab, the time limit) or an engine's ValueError."""
        if self.error is not None:
            raise self.error
        return self.answer


RunEvent = Waiting | Running | Replay | Left | Ended


class Run:
    """One visitor's run; leaving the context stops what is under way and gives up the model."""

    def __init__(self, request: RunRequest, handle: RunHandle, turn: Turn):
        """Find an identical recent run, else join the queue; ValueError when refused."""
        self.request, self.turn = request, turn
        self.key = request.setup_key()
        self.control = RunControl(run_time_limit_s())
        self.ticket = None
        self._recent = self._find_recent()
        self._job: Job | None = None
        self._stages: list[Callable[[], Job | None]] = []
        self._answer: RunAnswer | None = None
        self._progress: dict[str, EngineProgress] = {}
        self._started_s: float | None = None
        self.server_names: list[str] = []  # the chosen servers, host's order, once checked
        self._owns_lock = False  # the model's lock, from its turn to its close
        self._handle = handle
        if self._recent is None:
            model, setup = request.model, self.key if request.replay else None
            reference = model.reference_for(request.config.batch_invariant)
            work = run_work(request.requests, request.config, request.options, reference)
            self.ticket = model.queue.join(str(id(handle)), work, setup)
            handle.queued(turn, functools.partial(model.queue.leave, self.ticket))

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def queued(self) -> bool:
        return self._recent is None and self._started_s is None

    def wait(self, timeout_s: float | None) -> RunEvent:
        if self._recent is not None:
            return Replay(self._recent)
        if self._started_s is None:
            return self._wait_turn(timeout_s)
        if self._job is None:
            return self._next_job()  # held before a server (``SHOW``), or ended
        job = self._job
        try:
            if not job.wait(timeout_s):
                return self._running()
            value = job.result()
        except (RunStopped, ValueError) as exc:
            return self._end(exc)
        finally:
            if job.ended:
                job.close()
        return self._next_stage(value)

    def lend(self) -> None:
        """Call just before yielding the run's place to Gradio (``RunQueue.lend``)."""
        if self.queued and self.ticket is not None:
            self.request.model.queue.lend(self.ticket)

    def stop(self) -> None:
        self.control.stop()
        if self._job is not None:
            self._job.stop()

    def finish(self, on_kept: Callable[[], None]) -> None:
        """Shown: ``on_kept()`` (unless abandoned), then free the model and teach the pace."""
        if not self.turn.abandoned:
            on_kept()
        self._release_lock()
        wall_s = time.monotonic() - self._started_s
        parts_s = pace_parts(self._answer.comparison.traces())
        parts_s.update({server_part(n): s for n, s in self._answer.server_stages_s.items()})
        model = self.request.model
        model.queue.finish(self.ticket, wall_s, parts_s)
        ratios = model.queue.pace.server_ratios  # this run's servers', for the next page here
        ran = {name: ratios[name] for name in self._answer.server_stages_s if name in ratios}
        if ran and model.servers is not None:
            model.servers.keep_stage_ratios(ran)

    def close(self) -> None:
        if self._job is not None:
            self._job.close()
            self._job = None
        self._release_lock()
        if self.ticket is not None:
            self.request.model.queue.leave(self.ticket)

    # --- the queue ------------------------------------------------------------------------------

    def _find_recent(self) -> RecentRun | None:
        return self.request.model.recent.find(self.key) if self.request.replay else None

    def _wait_turn(self, timeout_s: float | None) -> RunEvent:
        """Wait for the turn, then start the engines (or show an identical run finished since)."""
        queue = self.request.model.queue
        try:
            turn_now = queue.wait_turn(self.ticket, timeout_s=timeout_s)
            place = None if turn_now else queue.place(self.ticket)
        except ValueError:  # taken out of the queue: Stop (the queue wakes it at once)
            return Left()
        if self.turn.stop_requested:
            return Left()
        if (recent := self._find_recent()) is not None:
            self._recent = recent
            return Replay(recent)
        if not turn_now:
            return Waiting(place)
        self._begin()
        return self._running()

    def _begin(self) -> None:
        request = self.request
        self._handle.attach(self.turn, self)  # Stop now stops this run
        request.model.lock.acquire()
        self._owns_lock = True
        self._started_s = time.monotonic()
        self.control.start_clock()  # the run limit counts from its turn, not from its press
        self._stages = [self._server_stages, self._judge_job]
        job = ComparisonJob(
            request.requests,
            request.config,
            compare_hf=request.options.compare_hf,
            check_reference=request.options.check_reference,
            dtype=request.model.dtype_name,
            model=request.model.model_id,
        )
        self._job = request.model.worker.submit(work_in_worker, (job,), self.control, self._take)

    # --- the jobs -------------------------------------------------------------------------------

    def _next_stage(self, value) -> RunEvent:
        if self._answer is None:
            self._answer = RunAnswer(value)
        elif isinstance(value, tuple):  # a server's trace or failure, and its stage seconds
            traces, failures, stages_s = value
            self._answer.servers.update(traces)
            self._answer.server_failures.update(failures)
            self._answer.server_stages_s.update(stages_s)
        else:
            self._answer.server_verdicts = value
        self._job = None
        return self._next_job()

    def _next_job(self) -> RunEvent:
        """Send the next stage's job; at ``SHOW``, hand the answer so far to the page first."""
        while self._stages and self._job is None:
            stage = self._stages.pop(0)
            if stage is SHOW:
                try:
                    self.control.check()
                except RunStopped:
                    continue
                return self._running(shown=self._answer.so_far())
            try:
                self._job = stage()
            except ValueError as exc:
                return self._end(exc)
        return self._running() if self._job is not None else Ended(self._answer)

    def _server_stages(self) -> None:
        """The chosen servers' jobs after ``SHOW``; ValueError for a server not set up."""
        request = self.request
        if not request.options.servers:
            return None
        self.server_names = request.model.servers.check_names(request.options.servers)
        jobs = [functools.partial(self._server_job, name) for name in self.server_names]
        self._stages[:0] = [stage for job in jobs for stage in (SHOW, job)]
        return None

    def _server_job(self, name: str) -> Job | None:
        """One server's run on the page's engine thread (None after a stop: listed as not run)."""
        try:
            self.control.check()
        except RunStopped as exc:
            self._answer.server_failures[name] = f"not run: {exc}"
            return None
        request, model = self.request, self.request.model
        args = ([name], request.requests, request.config, self._answer.comparison.dtype)
        return ThreadWorker(model).submit(_run_servers, args, self.control, self._take)

    def _judge_job(self) -> Job | None:
        """The judgeable servers' verdicts (None after a stop, or without the reference check)."""
        answer = self._answer
        traces = {n: t for n, t in answer.servers.items() if self.request.judged(t)}
        if answer.comparison.verdicts is None or not traces:
            return None
        try:
            self.control.check()  # a stopped run asks the worker for nothing more
        except RunStopped:
            return None
        requests, model_id = self.request.requests, self.request.model.model_id
        job = JudgeJob(requests, traces, answer.comparison.dtype, self._invariant, model_id)
        return self.request.model.worker.submit(judge_in_worker, (job,), self.control, untaken)

    @property
    def _invariant(self) -> bool:
        return self._answer.comparison.batch_invariant

    def _take(self, entry: EngineProgress) -> None:
        """Keep ``entry`` as its engine's progress and tell the queue the steps done, and when (and
        when a server's stage began streaming)."""
        kept = self._progress.get(entry.name)
        if entry.trace is None and kept is not None:
            entry = dataclasses.replace(entry, trace=kept.trace)
        self._progress[entry.name] = entry
        steps = sum(p.num_steps for n, p in self._progress.items() if n in QUEUED_ENGINES)
        queue = self.request.model.queue
        queue.progress(self.ticket, steps, entry.sent_s)
        if entry.trace is not None and entry.trace.info.get("server"):  # a server streams
            queue.server_began(self.ticket, entry.name, entry.sent_s)

    def _running(self, shown: RunAnswer | None = None) -> Running:
        elapsed_s = time.monotonic() - self._started_s
        return Running(dict(self._progress), elapsed_s, self.control.time_limit_s, shown)

    def _end(self, exc: BaseException) -> Ended:
        """A job failed or was stopped: the judge's failure leaves the servers unjudged."""
        self._job, self._stages = None, []
        if self._answer is not None and self._answer.servers:
            return Ended(self._answer)
        return Ended(None, exc)

    def _release_lock(self) -> None:
        if self._owns_lock:
            self._owns_lock = False
            self.request.model.lock.release()


def _run_servers(model: PageModel, names, requests, config: EngineConfig, dtype, watch) -> tuple:
    """``server_runs.run_servers`` as a job: (traces, failures, stage seconds) by name."""
    servers = model.servers
    clock = StageClock(watch, ready=lambda name: servers.status(name).state == server_set.READY)
    found = server_runs.run_servers(servers, names, requests, config, clock.watch, dtype)
    return (*found, clock.stages_s())


class StageClock:
    """Times servers run one after another, each stage from its first report with the server
    ``ready`` to the next server's first report (a wait for its first start left out)."""

    def __init__(
        self,
        watch: Callable,
        ready: Callable[[str], bool] = lambda _name: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._watch, self._ready, self._clock = watch, ready, clock
        self._first_s: dict[str, float] = {}  # in order of their first report
        self._ready_s: dict[str, float] = {}  # their first report with the server ready

    def watch(self, name: str, *args, **named) -> None:
        """``ProgressLog.watch``, keeping the times of ``name``'s first report and first ready."""
        now_s = self._clock()
        self._first_s.setdefault(name, now_s)
        if name not in self._ready_s and self._ready(name):
            self._ready_s[name] = now_s
        self._watch(name, *args, **named)

    def stages_s(self) -> dict[str, float]:
        names = list(self._first_s)
        ends = [*(self._first_s[n] for n in names[1:]), self._clock()]
        starts = [self._ready_s.get(n, self._first_s[n]) for n in names]
        return {n: end - start for n, start, end in zip(names, starts, ends, strict=True)}
