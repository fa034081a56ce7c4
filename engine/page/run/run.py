"""One Run, one object: a pressed Run from its place in the queue to its answer.

The page's seam, shaped as ``engine.worker.comparison`` is the worker's: a typed ``RunRequest``
in, typed progress (``Waiting``, ``Running``) and a typed end (``Replay``, ``Left``, ``Ended``)
out. The Run handler polls ``Run.wait``, the run's one wait loop::

    Waiting(place) ─▶ Running(progress) ─▶ Ended(RunAnswer | error)
       ├─▶ Replay(recent run)   an identical run finished first
       └─▶ Left                 Stop took it out of the queue

A ``Run`` owns the queue ticket (``run_queue``), its ``Turn`` (``run_handle``: Stop stops this
object), the model's lock while it runs, and the worker's ``Job`` under way: the engines in the
model's worker (``ComparisonJob``), then the chosen servers on the page's engine thread
(``host_servers``), then their verdicts in the worker (``JudgeJob``). Every job goes through one
transport interface (``engine.worker.transport``), and nothing relays between them.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.page.run import host_servers
from engine.page.run.queue_ticket import Place
from engine.page.run.recent_runs import RecentRun
from engine.page.run.run_cost import run_work
from engine.page.run.run_handle import RunHandle, Turn
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel
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


@dataclass(frozen=True)
class RunRequest:
    """What a Run asks: ``requests`` on ``model`` (in the run's precision) under ``config``;
    ``replay``: an identical recent run may be shown instead; ``judged(trace)``: whether a
    server's outputs are judged against the reference."""

    model: PageModel
    requests: list[Request]
    config: EngineConfig
    options: RunOptions
    replay: bool = True
    judged: Callable[[Trace], bool] = lambda _trace: True

    def setup_key(self) -> tuple:
        """What makes two runs identical: the model and its precision, the tokenized requests
        (prompt ids, caps, arrivals, sampling settings) and every engine knob. Not the x axis,
        which only changes how a run is drawn, nor the precision knob: ``model`` is the run's
        (a page sends "float32" where an API client sends nothing, and both are one run), nor
        the model knob: ``model`` is the run's, named by its allowlist id."""
        rows = tuple(
            (tuple(r.prompt_token_ids), r.max_new_tokens, r.arrival_s, repr(r.sampling))
            for r in self.requests
        )
        knobs = repr(dataclasses.replace(self.options, dtype=None, model=None))
        model = (self.model.model_id, self.model.label, self.model.dtype_name)
        return (*model, repr(self.config), knobs, rows)


@dataclass
class RunAnswer:
    """A finished run: the engines' ``ComparisonResult``, the servers' traces and failures by
    name, and the verdicts of the servers judged (None: none)."""

    comparison: ComparisonResult
    servers: dict[str, Trace] = field(default_factory=dict)
    server_failures: dict[str, str] = field(default_factory=dict)
    server_verdicts: dict[str, dict[int, dict]] | None = None


@dataclass(frozen=True)
class Waiting:
    place: Place


@dataclass(frozen=True)
class Running:
    progress: dict[str, EngineProgress]
    elapsed_s: float
    time_limit_s: float | None


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
        """The answer.

        Raises:
            RunStopped: Stop, a closed tab or the time limit ended the run.
            ValueError: bad input only an engine could see.
        """
        if self.error is not None:
            raise self.error
        return self.answer


RunEvent = Waiting | Running | Replay | Left | Ended


class Run:
    """One visitor's run (see the module docstring); a context manager: leaving it stops what is
    under way and gives up the queue's place and the model."""

    def __init__(self, request: RunRequest, handle: RunHandle, turn: Turn):
        """Find an identical recent run, else join the model's queue.

        Raises:
            ValueError: the queue refused the run (one already queued for this session, or far
                over the run limit), or ``CBP_RUN_TIME_LIMIT_S`` is not a time limit.
        """
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
        """Still waiting for its turn on the model."""
        return self._recent is None and self._started_s is None

    def wait(self, timeout_s: float | None) -> RunEvent:
        """Wait up to ``timeout_s`` for the run to move on; what the page shows now."""
        if self._recent is not None:
            return Replay(self._recent)
        if self._started_s is None:
            return self._wait_turn(timeout_s)
        if self._job is None:
            return Ended(self._answer)
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

    def stop(self) -> None:
        """Stop the run's engines (Stop, a closed tab): they end within a step."""
        self.control.stop()
        if self._job is not None:
            self._job.stop()

    def finish(self, on_kept: Callable[[], None]) -> None:
        """The ended run was shown: ``on_kept()`` (keep it for identical runs: first, so those
        waiting see it; not for an abandoned tab), then give up the model and teach the queue
        its pace."""
        if not self.turn.abandoned:
            on_kept()
        self._release_lock()
        wall_s = time.monotonic() - self._started_s
        parts_s = pace_parts(self._answer.comparison.traces())
        self.request.model.queue.finish(self.ticket, wall_s, parts_s)

    def close(self) -> None:
        """Stop what is under way, free the model and leave the queue (no-ops when done)."""
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
        """Wait for the model's turn; at it, start the engines. A recent run of this setup that
        finished meanwhile is shown instead: in a room, the first run serves all who waited."""
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
        self._stages = [self._servers_job, self._judge_job]
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
        """Take a job's value into the answer and send the next job, if any."""
        if self._answer is None:
            self._answer = RunAnswer(value)
        elif isinstance(value, tuple):  # the servers' traces and failures
            self._answer.servers, self._answer.server_failures = value
        else:
            self._answer.server_verdicts = value
        self._job = None
        while self._stages and self._job is None:
            try:
                self._job = self._stages.pop(0)()
            except ValueError as exc:
                return self._end(exc)
        return self._running() if self._job is not None else Ended(self._answer)

    def _servers_job(self) -> Job | None:
        """The chosen servers, after our engines, on the page's engine thread: they report
        their failures and stops instead of raising them."""
        request, model = self.request, self.request.model
        if not request.options.servers:
            return None
        names = model.servers.check_names(request.options.servers)
        args = (names, request.requests, request.config, self._answer.comparison.dtype)
        return ThreadWorker(model).submit(_run_servers, args, self.control, self._take)

    def _judge_job(self) -> Job | None:
        """The verdicts of the servers the reference can judge; none after a stop, or without
        the reference check (the page then names their differences by request)."""
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
        return self.request.model.worker.submit(judge_in_worker, (job,), self.control, _untaken)

    @property
    def _invariant(self) -> bool:
        return self._answer.comparison.batch_invariant

    def _take(self, entry: EngineProgress) -> None:
        """Keep ``entry`` as its engine's progress (its trace None: the last one still holds),
        and tell the queue the steps done, and when (read late, they are timed right)."""
        kept = self._progress.get(entry.name)
        if entry.trace is None and kept is not None:
            entry = dataclasses.replace(entry, trace=kept.trace)
        self._progress[entry.name] = entry
        steps = sum(p.num_steps for n, p in self._progress.items() if n in QUEUED_ENGINES)
        self.request.model.queue.progress(self.ticket, steps, entry.sent_s)

    def _running(self) -> Running:
        elapsed_s = time.monotonic() - self._started_s
        return Running(dict(self._progress), elapsed_s, self.control.time_limit_s)

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


def _untaken(_entry) -> None:
    """The ``take`` of a job whose progress nobody shows (the verdicts)."""


def _run_servers(model: PageModel, names, requests, config: EngineConfig, dtype, watch) -> tuple:
    """``host_servers.run_servers`` as a job: (traces, failures) by name."""
    return host_servers.run_servers(
        model.servers,
        names,
        requests,
        config.num_slots,
        watch,
        dtype=dtype,
        batch_invariant=config.batch_invariant,
        prefix_caching=config.prefix_caching,
    )
