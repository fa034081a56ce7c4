"""vLLM's own schedule, step by step: a scheduler class that vLLM loads and that records it.

Runs inside vLLM (0.32), not here: it imports only ``vllm`` and the standard library, and no module
of this project imports it (``tests/engine/peers/test_vllm_record.py`` checks both)::

    PYTHONPATH=<this repository> CBP_VLLM_SCHEDULE_PATH=/tmp/schedule.jsonl \\
        vllm serve MODEL --scheduler-cls engine.peers.vllm_scheduler.RecordingScheduler

The record's format (file and ``GET /record``), the request hold and data parallelism are in
docs/servers.md ("vLLM from the inside"); ``engine.peers.vllm_record`` reads it back.
"""

from __future__ import annotations

import hmac
import itertools
import json
import os
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

SCHEDULE_PATH_ENV = "CBP_VLLM_SCHEDULE_PATH"
RECORD_FORMAT = 1  # the ``format`` of the start line; bumped when a field changes meaning
HOLD_FOR_KEY = "cbp_hold_for"  # extra_args: how many requests of the run to wait for
HOLD_RUN_KEY = "cbp_run"  # extra_args: the run's tag
HOLD_ORDER_KEY = "cbp_order"  # extra_args: the request's place in its run's order
HOLD_LIMIT_S = 5.0  # the longest a run's first step is held
RECORD_ADDRESS_ENV = "CBP_VLLM_RECORD_ADDRESS"
RECORD_TOKEN_ENV = "CBP_VLLM_RECORD_TOKEN"
RECORD_STEPS_ENV = "CBP_VLLM_RECORD_STEPS"
DEFAULT_MAX_NUM_STEPS = 4096  # a few KiB of JSON each at most: a few MiB of memory
RECORD_PATH = "/record"
RECORD_KIND = "cbp-vllm-schedule"  # the ``record`` field: what the HTTP record serves
DEFAULT_HOST = "127.0.0.1"


class _Recording:
    """The recording, mixed in before vLLM's scheduler class (``Scheduler`` or its subclass)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(SCHEDULE_PATH_ENV, "").strip()
        self._dp_rank, self._dp_size = _data_parallel(self.vllm_config)
        port_offset = self._dp_rank if self._dp_size > 1 else 0
        self._record_server = server_from_environment(port_offset)
        if not path and self._record_server is None:
            raise ValueError(
                f"{type(self).__name__} records vLLM's schedule into the file named by "
                f"${SCHEDULE_PATH_ENV}, or serves it at ${RECORD_ADDRESS_ENV} (HOST:PORT), or "
                "both; set one (e.g. /tmp/schedule.jsonl) where vLLM starts."
            )
        self._record_file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._num_schedules = 0
        self._pending: dict[int, tuple[dict, float]] = {}  # id(output) -> (record, build_s)
        self._last_write_s = 0.0
        self._held_runs: set[str] = set()  # runs held already (their hold is over)
        self._seen_runs: set[str] = set()  # runs whose start reset the prefix cache
        self._hold: tuple[str, float] | None = None  # the run being held, since (monotonic s)
        self._write(self._start_record())
        self._last_write_s = 0.0  # the start line is no step's cost

    def _start_record(self) -> dict:
        sched, cache = self.scheduler_config, self.cache_config
        return {
            "event": "start",
            "format": RECORD_FORMAT,
            "unix_s": time.time(),
            "pid": os.getpid(),
            "vllm": vllm.__version__,
            "scheduler": _vllm_base(type(self)).__name__,
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "chunked_prefill": bool(sched.enable_chunked_prefill),
            "async_scheduling": bool(sched.async_scheduling),
            "prefix_caching": bool(cache.enable_prefix_caching),
            "block_size": self.block_size,
            "num_blocks": self.kv_cache_config.num_blocks,
            "num_kv_groups": len(self.kv_cache_config.kv_cache_groups),
            "hold_limit_s": HOLD_LIMIT_S,
            "dtype": _dtype_name(self.vllm_config),
            "dp_rank": self._dp_rank,
            "dp_size": self._dp_size,
        }

    def schedule(self, *args, **kwargs):
        if self._holding():
            return self._empty_schedule(*args, **kwargs)
        start_unix_s = time.time()
        output = super().schedule(*args, **kwargs)
        t0 = time.perf_counter()
        record = self._step_record(output, start_unix_s)
        self._pending[id(output)] = (record, time.perf_counter() - t0)
        return output

    def _holding(self) -> bool:
        """Whether to start nothing yet (docs/servers.md, "Holding the first step"); resets the
        prefix cache for a run seen for the first time while nothing runs."""
        if self.running:
            return False
        runs: dict[str, list[int]] = {}  # run -> its waiting requests' hold_for (0: no hold)
        for request in self.waiting:
            extra = _extra(request)
            if extra.get(HOLD_RUN_KEY) is not None:
                runs.setdefault(str(extra[HOLD_RUN_KEY]), []).append(
                    int(extra.get(HOLD_FOR_KEY) or 0)
                )
        if set(runs) - self._seen_runs:
            self._seen_runs |= set(runs)
            self.reset_prefix_cache()  # nothing runs, so no block is held: it succeeds
        runs = {r: w for r, w in runs.items() if any(w) and r not in self._held_runs}
        if not runs:
            return False
        run, wanted = next(iter(runs.items()))  # the run of the oldest held request
        now_s = time.monotonic()
        if self._hold is None or self._hold[0] != run:
            self._hold = (run, now_s)
        if len(wanted) >= max(wanted) or now_s - self._hold[1] > HOLD_LIMIT_S:
            self._held_runs.add(run)  # go: all came, or the limit passed
            self._hold = None
            self._order_run(run)
            return False
        return True

    def _order_run(self, run: str) -> None:
        """Put a held run's waiting requests in its own order (``cbp_order``), in the places
        they hold in the queue."""
        queue = self.waiting
        if not isinstance(queue, deque):  # the priority policy's heap: its own order
            return
        items = list(queue)
        places = [i for i, r in enumerate(items) if str(_extra(r).get(HOLD_RUN_KEY)) == run]
        ordered = sorted((items[i] for i in places), key=lambda r: _extra(r).get(HOLD_ORDER_KEY, 0))
        for i, request in zip(places, ordered, strict=True):
            items[i] = request
        queue.clear()
        queue.extend(items)

    def _empty_schedule(self, *args, **kwargs):
        """vLLM's own schedule with no token budget: a step with no tokens, not recorded."""
        budget = self.max_num_scheduled_tokens
        self.max_num_scheduled_tokens = 0
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens = budget

    def update_from_output(self, scheduler_output, model_runner_output):
        end_unix_s = time.time()
        pending = self._pending.pop(id(scheduler_output), None)
        if pending is not None:
            record, build_s = pending
            record["end_unix_s"] = end_unix_s
            record["record_s"] = build_s + self._last_write_s
            self._write(record)
        return super().update_from_output(scheduler_output, model_runner_output)

    def shutdown(self) -> None:
        super().shutdown()
        if self._record_file is not None:
            self._record_file.close()
        if self._record_server is not None:
            self._record_server.close()

    def _write(self, record: dict) -> None:
        t0 = time.perf_counter()
        line = json.dumps(record, separators=(",", ":"))
        if self._record_file is not None:
            self._record_file.write(line + "\n")
            self._record_file.flush()
        if self._record_server is not None:
            if record["event"] == "start":
                self._record_server.ring.set_start(line)
            else:
                self._record_server.ring.append(line)
        self._last_write_s = time.perf_counter() - t0

    def _step_record(self, output, start_unix_s: float) -> dict:
        new = {r.req_id: r for r in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        position = {req_id: i for i, req_id in enumerate(cached.req_ids)}
        scheduled = []
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            entry = {"req_id": req_id, "num_tokens": num_tokens}
            if req_id in new:
                r = new[req_id]
                entry |= {"new": True, "num_prompt": r.prompt_len}
                entry["num_computed"] = r.num_computed_tokens
                entry["block_ids"] = _first_group(r.block_ids)
            else:
                i = position[req_id]
                entry["num_computed"] = cached.num_computed_tokens[i]
                entry["num_output"] = cached.num_output_tokens[i]
                blocks = _first_group(cached.new_block_ids[i])
                entry["block_ids" if req_id in cached.resumed_req_ids else "new_block_ids"] = blocks
            scheduled.append(entry)
        num_running, num_waiting = self.get_request_counts()
        step = self._num_schedules
        self._num_schedules += 1
        return {
            "event": "step",
            "step": step,
            "start_unix_s": start_unix_s,
            "num_tokens": output.total_num_scheduled_tokens,
            "scheduled": scheduled,
            "resumed": sorted(cached.resumed_req_ids),
            "preempted": sorted(output.preempted_req_ids or ()),
            "finished": sorted(output.finished_req_ids),
            "num_running": num_running,
            "num_waiting": num_waiting,
            "kv_usage": self.kv_cache_manager.usage,
            "dp_rank": self._dp_rank,
        }


def _extra(request) -> dict:
    """A request's ``vllm_xargs`` (``sampling_params.extra_args``; {} without)."""
    return getattr(request.sampling_params, "extra_args", None) or {}


def _data_parallel(vllm_config) -> tuple[int, int]:
    parallel = getattr(vllm_config, "parallel_config", None)
    rank = int(getattr(parallel, "data_parallel_rank", 0) or 0)
    return rank, max(int(getattr(parallel, "data_parallel_size", 1) or 1), 1)


def _vllm_base(cls: type) -> type:
    return next(c for c in cls.__mro__ if c.__module__.startswith("vllm."))


def _first_group(block_ids) -> list[int]:
    """The first KV cache group's block ids (vLLM gives one list per group; None: none new)."""
    return list(block_ids[0]) if block_ids else []


# --- the record over HTTP (standard library only) -----------------------------------------------
# Kept in this file, so that a copy of this one file is all a vLLM deployment needs; the section
# is over the house's 300 lines a file for that reason.


class StepRing:
    """The ``start`` line and the latest ``max_num_steps``
    step lines, indexed from 0; thread-safe."""

    def __init__(self, max_num_steps: int = DEFAULT_MAX_NUM_STEPS):
        if max_num_steps < 1:
            raise ValueError(
                f"the record's ring needs room for 1 step at least, not {max_num_steps}"
            )
        self.max_num_steps = max_num_steps
        self._start = "null"  # the start line's JSON text
        self._steps: deque[str] = deque(maxlen=max_num_steps)
        self._next = 0  # the index the next step line gets
        self._lock = threading.Lock()

    def set_start(self, line: str) -> None:
        with self._lock:
            self._start = line

    def append(self, line: str) -> None:
        with self._lock:
            self._steps.append(line)
            self._next += 1

    def body(self, since: int) -> bytes:
        """The JSON answer to ``GET /record?since=...`` (fields: docs/servers.md)."""
        with self._lock:
            oldest = self._next - len(self._steps)
            skip = min(max(since - oldest, 0), len(self._steps))
            steps = list(itertools.islice(self._steps, skip, None))
            start, next_index = self._start, self._next
        head = (
            f'{{"record":"{RECORD_KIND}","format":{RECORD_FORMAT},"start":{start},'
            f'"oldest":{oldest},"next":{next_index},"max_num_steps":{self.max_num_steps},'
        )
        return (head + '"steps":[' + ",".join(steps) + "]}").encode("utf-8")


def parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` from ``HOST:PORT``, ``:PORT`` or ``PORT`` (host: 127.0.0.1). Raises
    ValueError: the port is not a number from 0 to 65535."""
    host, _, port = address.strip().rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"${RECORD_ADDRESS_ENV}={address!r}: give HOST:PORT, e.g. 127.0.0.1:8100 (PORT 0: any)"
        )
    return host or DEFAULT_HOST, int(port)


class RecordServer:
    """The ring, served by a ``ThreadingHTTPServer`` on a daemon thread."""

    def __init__(self, address: str, token: str = "", max_num_steps: int = DEFAULT_MAX_NUM_STEPS):
        self.ring = StepRing(max_num_steps)
        host, port = parse_address(address)
        try:
            self._httpd = ThreadingHTTPServer((host, port), _handler(self, token))
        except OSError as exc:
            raise ValueError(
                f"${RECORD_ADDRESS_ENV}={address!r}: cannot serve the record there ({exc}); "
                "pick a free port, or PORT 0 for any"
            ) from exc
        self._httpd.daemon_threads = True
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="cbp-record-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def server_from_environment(port_offset: int = 0) -> RecordServer | None:
    """The server ``$CBP_VLLM_RECORD_ADDRESS`` asks for (None when it is unset or blank), on its
    port plus ``port_offset`` (a data-parallel rank's; port 0 stays any free one). Raises
    ValueError: a bad address or ring size, or an address that cannot be bound."""
    address = os.environ.get(RECORD_ADDRESS_ENV, "").strip()
    if not address:
        return None
    host, port = parse_address(address)
    if port and port_offset:
        address = f"{host}:{port + port_offset}"
    steps_text = os.environ.get(RECORD_STEPS_ENV, "").strip() or str(DEFAULT_MAX_NUM_STEPS)
    if not steps_text.isdigit() or int(steps_text) < 1:
        raise ValueError(f"${RECORD_STEPS_ENV}={steps_text!r}: give a number of steps, e.g. 4096")
    token = os.environ.get(RECORD_TOKEN_ENV, "").strip()
    return RecordServer(address, token, int(steps_text))


def _handler(server: RecordServer, token: str) -> type[BaseHTTPRequestHandler]:
    expected = f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            given = self.headers.get("Authorization", "").encode()
            if token and not hmac.compare_digest(given, expected):
                self._answer(401, _message(f"send Authorization: Bearer <${RECORD_TOKEN_ENV}>"))
                return
            url = urlsplit(self.path)
            if url.path.rstrip("/") != RECORD_PATH:
                self._answer(404, _message(f"the record is at GET {RECORD_PATH}?since=N"))
                return
            since = parse_qs(url.query).get("since", ["0"])[-1]
            if not since.isdigit():
                self._answer(400, _message(f"since={since!r}: give a step index (0 or more)"))
                return
            self._answer(200, server.ring.body(int(since)))

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # no line per request in vLLM's log
            pass

    return Handler


def _message(text: str) -> bytes:
    return json.dumps({"error": text}).encode("utf-8")


class RecordingSyncScheduler(_Recording, Scheduler):
    """vLLM's ``Scheduler``, recording each step (async scheduling off, as on CPUs)."""


class RecordingAsyncScheduler(_Recording, AsyncScheduler):
    """vLLM's ``AsyncScheduler``, recording each step (async scheduling on)."""


class RecordingScheduler:
    """The class ``--scheduler-cls`` names: builds the recording subclass of the scheduler vLLM
    would have chosen (``SchedulerConfig.get_scheduler_cls``), by ``async_scheduling``."""

    def __new__(cls, *args, vllm_config, **kwargs):
        async_on = vllm_config.scheduler_config.async_scheduling
        chosen = RecordingAsyncScheduler if async_on else RecordingSyncScheduler
        return chosen(*args, vllm_config=vllm_config, **kwargs)


def _dtype_name(vllm_config) -> str | None:
    dtype = getattr(getattr(vllm_config, "model_config", None), "dtype", None)
    return None if dtype is None else str(dtype).removeprefix("torch.")
