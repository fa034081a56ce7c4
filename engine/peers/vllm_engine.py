"""vLLM as an engine, seen from the inside too: any recording vLLM endpoint, and a local vLLM.

``RecordedEngine`` plays a workload as ``OpenAIEngine`` does and reads the server's own record of
the run into the trace's ``schedule`` (None, with one warning, when the record cannot be read);
``VllmEngine`` owns a local ``VllmServer``. docs/servers.md.
"""

from __future__ import annotations

import dataclasses
import secrets
import time

from engine.peers.openai_engine import OpenAIEngine
from engine.peers.openai_probe import ServerInfo
from engine.peers.vllm_record import (
    REQUEST_ID_HEADER,
    RecordError,
    RecordFeed,
    ScheduleLog,
    external_request_id,
    schedule_trace,
)
from engine.peers.vllm_server import (
    HOLD_FOR_KEY,
    HOLD_ORDER_KEY,
    HOLD_RUN_KEY,
    MAX_MODEL_LEN,
    VllmServer,
    VllmSettings,
    settings_for,
    vllm_python,
)
from engine.sequence import Request
from engine.trace import Trace

LATE_READ_S = 0.25  # a quiet host's client reads a token within tens of milliseconds


class RecordedEngine(OpenAIEngine):
    """An endpoint whose server records its steps; ``record`` None: seen from outside only."""

    def __init__(
        self, endpoint, loaded, num_slots: int, record: RecordFeed | ScheduleLog | None = None
    ):
        super().__init__(endpoint, loaded, num_slots)
        self.record = record
        self._run_tag: str | None = None  # the running run's tag in its request ids
        self._hold_for = 0  # requests vLLM's first step waits for (0: no hold)
        self._tagged = False  # whether this run's requests carry vllm_xargs

    def _record(self) -> RecordFeed | ScheduleLog | None:
        return self.record

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        """``OpenAIEngine.run`` with the server's own steps in ``schedule``; raises as it does."""
        info = self.server_info()  # the first run probes the server: its request precedes the mark
        record = self._record()
        mark, problem = _mark(record)
        self._run_tag = run_tag = secrets.token_hex(4)  # 8 hex digits, fresh per run
        self._tagged = record is not None and problem is None and info.version is not None
        all_at_0 = len(requests) > 1 and all(r.arrival_s == 0 for r in requests)
        self._hold_for = len(requests) if all_at_0 and self._tagged else 0
        t0_unix_s = time.time()
        try:
            trace = super().run(requests, on_step, on_wait)
        finally:
            self._run_tag, self._hold_for, self._tagged = None, 0, False
        if record is None:
            return trace
        where = {**_source(record), "run_tag": run_tag, "t0_unix_s": t0_unix_s}
        if problem is None:
            trace.schedule, problem = self._read_schedule(trace, record, mark, run_tag, t0_unix_s)
            trace.warnings += late_reads(trace, self.name)
        if problem is not None:
            where["error"] = problem
            trace.warnings.append(problem)
        trace.info = {**trace.info, "schedule_record": where}
        return trace

    def _read_schedule(self, trace: Trace, record, mark: int, run_tag: str, t0_unix_s: float):
        """``(schedule, None)``, or ``(None, line)`` when the
        record has none of this run's steps."""
        try:
            records = record.read(mark)
            schedule = schedule_trace(records, trace.requests, run_tag, t0_unix_s, self.name)
        except RecordError as exc:
            return None, f"no inside view: {exc}"
        except (OSError, ValueError, KeyError) as exc:
            return None, f"vLLM's own schedule could not be read ({_named(record)}): {exc}"
        if trace.requests and not schedule.steps:
            return None, _no_step_line(record, schedule, run_tag, self.name)
        return schedule, None

    def _headers(self, request: Request) -> dict[str, str]:
        if self._run_tag is None:
            return {}
        return {REQUEST_ID_HEADER: external_request_id(self._run_tag, request.request_id)}

    def _body(self, request: Request) -> dict:
        """The body, with ``vllm_xargs`` naming its run and asking for the hold when it has one."""
        body = super()._body(request)
        if self._tagged:
            body["vllm_xargs"] = {HOLD_RUN_KEY: self._run_tag}
            if self._hold_for:
                body["vllm_xargs"] |= {
                    HOLD_FOR_KEY: self._hold_for,
                    HOLD_ORDER_KEY: request.request_id,
                }
        return body


class VllmEngine(RecordedEngine):
    """vLLM with ``--max-num-seqs`` = ``num_slots``, the loaded model's folder and dtype."""

    def __init__(
        self,
        loaded,
        num_slots: int,
        *,
        enforce_eager: bool = False,
        max_model_len: int = MAX_MODEL_LEN,
        settings: VllmSettings | None = None,
        cpus: str | None = None,
    ):
        """``max_model_len``: tokens, prompt and output, of the longest request it takes;
        ``settings``: the server's as they are, instead of ``settings_for`` these; ``cpus``: the
        CPUs it computes on (e.g. "1"; default every CPU). Raises ValueError: no ``.venv-vllm``
        (MissingBuild), or a model vLLM cannot serve (ModelRefused)."""
        vllm_python()  # a missing build is said before what the model lacks
        if settings is None:
            settings = settings_for(
                loaded, num_slots, enforce_eager=enforce_eager, max_model_len=max_model_len
            )
        if cpus is not None:
            settings = dataclasses.replace(settings, omp_threads_bind=cpus)
        self.server = VllmServer(settings)
        super().__init__(self.server.endpoint(), loaded, num_slots)

    def server_info(self) -> ServerInfo:
        info = super().server_info()
        info.settings.update(self.server.info())
        return info

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        self.start()
        return super().run(requests, on_step, on_wait)

    def _record(self) -> ScheduleLog | None:
        path = self.server.schedule_path
        if path is None:
            self.record = None
        elif self.record is None or self.record.path != path:
            self.record = ScheduleLog(path)
        return self.record


def endpoint_engine(endpoint, loaded, num_slots: int) -> OpenAIEngine:
    if endpoint.record_url is None:
        return OpenAIEngine(endpoint, loaded, num_slots)
    return RecordedEngine(endpoint, loaded, num_slots, RecordFeed(endpoint.record_url))


def late_reads(trace: Trace, name: str) -> list[str]:
    """One line when the client read first tokens over ``LATE_READ_S`` (mean) after the server's
    record had them: the host was too busy, so outside TTFT counts the wait."""
    if trace.schedule is None:
        return []
    inside = {r.request_id: r.first_token_s for r in trace.schedule.requests}
    gaps = [
        (r.first_token_s - inside[r.request_id], r.request_id)
        for r in trace.requests
        if r.first_token_s is not None and inside.get(r.request_id) is not None
    ]
    if not gaps or (mean_s := sum(g for g, _ in gaps) / len(gaps)) <= LATE_READ_S:
        return []
    worst_s, worst = max(gaps)
    return [
        f"This host's client read {name}'s first tokens {mean_s:.2f} s after {name}'s own record "
        f"had them (mean; up to {worst_s:.2f} s, R{worst}): the host was too busy to read the "
        "streams on time. TTFT from outside counts that wait; inside is the server's own."
    ]


def _mark(record) -> tuple[int, str | None]:
    """``(mark, None)``, or ``(0, line)`` when the record cannot be read."""
    if record is None:
        return 0, None
    try:
        return record.mark(), None
    except RecordError as exc:
        return 0, f"no inside view: {exc}"


def _source(record) -> dict:
    return {"url": record.url} if isinstance(record, RecordFeed) else {"path": str(record.path)}


def _named(record) -> str:
    return next(iter(_source(record).values()))


def _no_step_line(record, schedule: Trace, run_tag: str, name: str) -> str:
    where = _named(record)
    if not isinstance(record, RecordFeed):
        return f"vLLM's own schedule ({where}) has no step of this run."
    seen = schedule.info.get("num_foreign_seqs", 0)
    what = f"only other requests ({seen} scheduled)" if seen else "no step"
    return (
        f"no inside view: the record at {where} holds {what} while this run ran (its requests "
        f"are cbp-{run_tag}-*): it is the record of another server, not of {name}'s; give "
        "--endpoint-record the record address of the vLLM that --endpoint names."
    )
