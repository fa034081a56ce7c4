"""The ``vllm`` engine: a local vLLM server on the loaded model, driven as an endpoint.

``VllmEngine`` owns a ``VllmServer`` (``engine.peers.vllm_server``) and plays workloads at it
through ``OpenAIEngine``, so its trace is an endpoint's trace (per-request times, server samples)
with the server's version and settings in ``trace.info["server"]["settings"]``. The server starts on
the first run, or earlier with ``start()`` (a caller that wants to show its start-up passes
``on_progress``), and stays up until ``close()``, so repeats and warm-ups pay the start once.

The server records its own schedule (``engine.peers.vllm_scheduler``, on by default): each run's
requests are sent as ``X-Request-Id: cbp-<run>-<id>``, and the run returns a ``VllmTrace``, the
client's trace as above plus ``schedule``, vLLM's steps read back from its record
(``engine.peers.vllm_record``); ``info["schedule_record"]`` says where they came from (the file,
the run's tag, ``t0_unix_s``). Both traces are on the wall clock of this machine: the client's times
count from just after ``t0_unix_s`` is read (the run's set-up, well under a millisecond, lies
between), vLLM's from ``t0_unix_s``.

When every request of a run arrives at 0 (and there are two or more), each is sent with
``vllm_xargs`` ``{"cbp_hold_for": <the run's count>, "cbp_run": <its tag>}``: the recording
scheduler holds vLLM's first step until all of them wait (at most a few seconds), so vLLM starts
with the whole workload as our engines do, not with whichever request reached it first. Every
request names its run (``cbp_run``, also without a hold), so vLLM starts each run with an empty
prefix cache, as our engines do, and a warm-up's blocks are no hits for the run after it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from engine.peers.openai_engine import OpenAIEngine
from engine.peers.openai_probe import ServerInfo
from engine.peers.vllm_record import (
    REQUEST_ID_HEADER,
    ScheduleLog,
    VllmTrace,
    external_request_id,
    new_run_tag,
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
)
from engine.sequence import Request
from engine.trace import Trace


class VllmEngine(OpenAIEngine):
    """vLLM with ``--max-num-seqs`` = ``num_slots``, the loaded model's folder and dtype."""

    def __init__(
        self,
        loaded,
        num_slots: int,
        *,
        enforce_eager: bool = False,
        name: str = "vllm",
        venv: str | None = None,
        max_model_len: int = MAX_MODEL_LEN,
        settings: VllmSettings | None = None,
    ):
        """``max_model_len``: the longest request (prompt and output tokens) the server takes;
        its KV cache is sized for that many tokens per slot. ``settings``: the server's settings
        as they are, instead of ``settings_for`` these (a KV budget or block size of one's own).

        Raises ValueError: no ``.venv-vllm`` (``make vllm``) or nothing vLLM could load."""
        if settings is None:
            settings = settings_for(
                loaded, num_slots, enforce_eager=enforce_eager, max_model_len=max_model_len
            )
        self.server = VllmServer(settings, venv)
        super().__init__(self.server.endpoint(name), loaded, num_slots)
        self._run_tag: str | None = None  # the running run's tag in its request ids
        self._hold_for = 0  # requests vLLM's first step waits for (0: no hold)
        self._log: ScheduleLog | None = None  # the server's schedule record, read run by run

    def start(self, on_progress: Callable[[str], None] | None = None) -> VllmEngine:
        """Start the server unless it runs; ``on_progress(line)`` sees its log while it starts.

        Raises:
            EndpointError: the server exited or did not become healthy (with its log's tail).
        """
        if not self.server.running:
            self._info = None  # a restarted server is probed again
            self.server.start(on_progress)
        return self

    def server_info(self) -> ServerInfo:
        info = super().server_info()
        info.settings.update(self.server.info())
        return info

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> VllmTrace:
        """``OpenAIEngine.run`` on the local server, started first if it is not running, with
        vLLM's own steps in ``schedule`` (None, with a warning, when its record is missing).

        Raises what ``OpenAIEngine.run`` raises (its partial trace has no ``schedule``).
        """
        self.start()
        self.server_info()  # the first run probes the server: its request comes before the mark
        log = self._schedule_log()
        mark = log.mark() if log is not None else 0
        self._run_tag = run_tag = new_run_tag()
        all_at_0 = len(requests) > 1 and all(r.arrival_s == 0 for r in requests)
        self._hold_for = len(requests) if all_at_0 else 0
        t0_unix_s = time.time()
        try:
            trace = super().run(requests, on_step, on_wait)
        finally:
            self._run_tag, self._hold_for = None, 0
        fields = {f.name: getattr(trace, f.name) for f in dataclasses.fields(Trace)}
        result = VllmTrace(**fields)
        if log is not None:
            where = {"path": str(log.path), "run_tag": run_tag, "t0_unix_s": t0_unix_s}
            result.info = {**result.info, "schedule_record": where}
            result.schedule = self._read_schedule(result, log, mark, run_tag, t0_unix_s)
        return result

    def _schedule_log(self) -> ScheduleLog | None:
        """The running server's record (a new one after a restart); None when it records none."""
        path = self.server.schedule_path
        if path is None:
            self._log = None
        elif self._log is None or self._log.path != path:
            self._log = ScheduleLog(path)
        return self._log

    def _read_schedule(self, trace: Trace, log: ScheduleLog, mark: int, run_tag: str, t0_unix_s):
        """vLLM's steps of this run as a ``Trace``; None, with a warning in ``trace``, if its
        record cannot be read or holds none of this run's steps."""
        try:
            records = log.read(mark)
            schedule = schedule_trace(records, trace.requests, run_tag, t0_unix_s, self.name)
        except (OSError, ValueError, KeyError) as exc:
            trace.warnings.append(f"vLLM's own schedule could not be read ({log.path}): {exc}")
            return None
        if trace.requests and not schedule.steps:
            trace.warnings.append(f"vLLM's own schedule ({log.path}) has no step of this run.")
            return None
        return schedule

    def _headers(self, request: Request) -> dict[str, str]:
        """``X-Request-Id: cbp-<run>-<id>``: vLLM's request ids then name our request."""
        if self._run_tag is None:
            return {}
        return {REQUEST_ID_HEADER: external_request_id(self._run_tag, request.request_id)}

    def _body(self, request: Request) -> dict:
        """The request's body, with ``vllm_xargs`` naming its run (the recording scheduler
        starts a run with an empty prefix cache) and asking for the hold when the run has one."""
        body = super()._body(request)
        if self._run_tag is not None and self.server.settings.record_schedule:
            body["vllm_xargs"] = {HOLD_RUN_KEY: self._run_tag}
            if self._hold_for:
                body["vllm_xargs"] |= {
                    HOLD_FOR_KEY: self._hold_for,
                    HOLD_ORDER_KEY: request.request_id,
                }
        return body

    def close(self) -> None:
        """Stop the server (and its engine processes)."""
        self.server.stop()
