"""An engine that is a server: any OpenAI-compatible ``/v1/completions``, driven like a client.

Each request is streamed at its arrival with ``max_tokens`` = its cap; the trace has the client's
times and no steps (the server hides its slots). The streams run on an asyncio loop in a thread.
``ServerRegistry`` holds such engines by name for the page and the bench, and starts and stops
the local ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import httpx

from engine.peers.endpoints import Endpoint, EndpointError
from engine.peers.openai_probe import ServerInfo, error_detail, parse_sse_line, probe, unreachable
from engine.peers.server_metrics import MetricsSampler
from engine.sequence import Request, truncate_at_stop
from engine.serving.run_control import WAIT_SLICE_S
from engine.trace import RequestRecord, Trace, new_request_records
from engine.workloads.workload import request_label

if TYPE_CHECKING:
    from engine.peers.server_process import ServerProcess

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 300.0  # the longest silence on a stream before the server counts as hung
CANCEL_TIMEOUT_S = 10.0  # how long cancelled streams get to close
LATE_SEND_S = 0.5  # a request sent this long after its arrival is reported as sent late


class OpenAIEngine:
    """Runs requests against one endpoint ``name``. A local engine owns its ``server`` process
    (``start``/``close``); ``fits_runs``: it resizes its server to each run's slots;
    ``matched_to``/``unmatched``/``followed``: the schedule comparison's match (module docs)."""

    server: ServerProcess | None = None
    fits_runs = False

    def __init__(self, endpoint: Endpoint, loaded, num_slots: int):
        """``loaded``: the ``LoadedModel`` whose tokenizer and EOS ids read the outputs;
        ``num_slots`` is only recorded (the server decides its own concurrency)."""
        self.endpoint = endpoint
        self.name = endpoint.name
        self.loaded = loaded
        self.num_slots = num_slots
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self._info: ServerInfo | None = None
        self.matched_to: str | None = None
        self.unmatched: list[str] = []
        self.followed = None

    @property
    def is_local(self) -> bool:
        """True for an engine that starts and stops its own server."""
        return self.server is not None

    def start(self, on_progress: Callable[[str], None] | None = None) -> OpenAIEngine:
        """Start the local server unless it runs (a remote endpoint: nothing to start). Raises
        EndpointError: it exited or never became healthy (with its log's tail)."""
        if self.server is not None and not self.server.running:
            self._info = None  # a restarted server is probed again
            self.server.start(on_progress)
        return self

    def close(self) -> None:
        """Stop the local server (a remote endpoint: nothing to stop)."""
        if self.server is not None:
            self.server.stop()

    def server_info(self) -> ServerInfo:
        """What the server serves and accepts (probed on first use). Raises EndpointError."""
        if self._info is None:
            self._info = probe(self.endpoint, self.loaded)
        return self._info

    @property
    def probed(self) -> ServerInfo | None:
        return self._info

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        """Play ``requests`` at the server; ``on_step`` is never called. Raises EndpointError:
        unreachable, refused request, stream cut; ``exc.trace`` is partial; Exception: whatever
        ``on_wait(trace)`` raises, after every stream is cancelled."""
        info = self.server_info()
        trace = Trace(engine=self.name, num_slots=self.num_slots)
        trace.requests = new_request_records(requests)
        trace.info = {"server": info.to_dict()}
        trace.warnings = list(info.warnings)
        self._mark_sampled(trace, requests, info)
        t0 = time.perf_counter()
        sampler = MetricsSampler(self.endpoint.url, t0, trace)
        try:
            with sampler:
                self._drive(requests, trace, t0, on_wait)
            trace.warnings += late_sends(trace, self.name)
        except EndpointError as exc:
            exc.trace = trace
            raise
        finally:
            trace.wall_s = max((r.finish_s or 0.0) for r in trace.requests) if requests else 0.0
            notes = {"metrics_note": sampler.note, "kv_pool": sampler.kv_pool}
            trace.info["server"] = {**trace.info["server"], **notes}
        return trace

    def _mark_sampled(self, trace: Trace, requests: list[Request], info: ServerInfo) -> None:
        for rec, request in zip(trace.requests, requests, strict=True):
            rec.comparable = not request.is_sampled
        if not _takes_top_k(info) and any(r.is_sampled and r.sampling.top_k for r in requests):
            trace.warnings.append(
                f"{self.name} does not take top_k (vLLM's extension of the OpenAI API): its "
                "sampled requests ran without their top_k limit."
            )

    def _drive(self, requests, trace: Trace, t0: float, on_wait) -> None:
        cancel = threading.Event()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"{self.name}-streams", daemon=True)
        thread.start()
        try:
            future = asyncio.run_coroutine_threadsafe(
                self._stream_all(requests, trace, t0, cancel), loop
            )
            while not concurrent.futures.wait([future], timeout=WAIT_SLICE_S).done:
                if on_wait is None:
                    continue
                try:
                    on_wait(trace)
                except BaseException:
                    cancel.set()
                    concurrent.futures.wait([future], timeout=CANCEL_TIMEOUT_S)
                    raise
            future.result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=CANCEL_TIMEOUT_S)
            if not thread.is_alive():
                loop.close()

    async def _stream_all(self, requests, trace: Trace, t0: float, cancel) -> None:
        """Raises EndpointError: the first stream that failed (the others are cancelled)."""
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        pending = sorted(requests, key=lambda r: r.arrival_order)
        tasks: list[asyncio.Task] = []
        async with httpx.AsyncClient(
            base_url=self.endpoint.url, timeout=timeout, limits=limits
        ) as c:
            try:
                while not cancel.is_set():
                    now_s = time.perf_counter() - t0
                    while pending and pending[0].arrival_s <= now_s:
                        request = pending.pop(0)
                        record = trace.request(request.request_id)
                        tasks.append(asyncio.create_task(self._stream(c, request, record, t0)))
                    failed = [t for t in tasks if t.done() and t.exception() is not None]
                    if failed:
                        raise failed[0].exception()
                    if not pending and all(t.done() for t in tasks):
                        return
                    wake_s = pending[0].arrival_s - now_s if pending else WAIT_SLICE_S
                    await asyncio.sleep(max(0.0, min(WAIT_SLICE_S, wake_s)))
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream(self, client, request: Request, rec: RequestRecord, t0: float) -> None:
        """Raises EndpointError."""
        label = request_label(request.request_id)
        pieces: list[str] = []
        ids: list[int] = []
        finish = None
        rec.admit_s = time.perf_counter() - t0
        try:
            body, headers = self._body(request), self._headers(request)
            async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    detail = error_detail(await r.aread())
                    raise EndpointError(
                        f"{self.name} refused {label}: HTTP {r.status_code}: {detail}"
                    )
                async for line in r.aiter_lines():
                    chunk = parse_sse_line(line)
                    if chunk is not None:
                        finish = self._take(chunk, rec, pieces, ids, t0, label) or finish
        except httpx.ConnectError as exc:
            raise unreachable(self.endpoint, exc) from exc
        except httpx.TransportError as exc:
            raise EndpointError(
                f"{self.name} stopped answering during {label} ({type(exc).__name__}); "
                "the server may have died or been stopped."
            ) from exc
        if finish is None:
            raise EndpointError(
                f"{self.name} ended the stream of {label} before it finished; "
                "the server may have died or been stopped."
            )
        self._finish(rec, request, pieces, ids, finish)

    def _headers(self, request: Request) -> dict[str, str]:
        return {}

    def _body(self, request: Request) -> dict:
        info = self.server_info()
        body = {
            "prompt": list(request.prompt_token_ids)
            if info.prompt_token_ids
            else self._text(request),
            "max_tokens": request.max_new_tokens,
            "temperature": 0,
            "stream": True,
        }
        if request.is_sampled:
            body |= _sampling_body(request.sampling, top_k=_takes_top_k(info))
        if info.model is not None:
            body["model"] = info.model
        if info.returns_token_ids:
            body["return_token_ids"] = True
        return body

    def _text(self, request: Request) -> str:
        """The prompt as text the server tokenizes back; without BOS, which the server adds."""
        tokenizer = self.loaded.tokenizer
        ids = list(request.prompt_token_ids)
        prefix = list(tokenizer("", add_special_tokens=True)["input_ids"])
        if prefix and ids[: len(prefix)] == prefix:
            ids = ids[len(prefix) :]
        return tokenizer.decode(ids, skip_special_tokens=False)

    def _take(self, chunk: dict, rec: RequestRecord, pieces, ids, t0: float, label: str):
        """Record one streamed chunk's tokens; its finish reason (None mid-stream)."""
        if "error" in chunk:
            detail = error_detail(json.dumps(chunk).encode())
            raise EndpointError(f"{self.name} failed during {label}: {detail}")
        choices = chunk.get("choices") or []
        if not choices:
            return None  # a usage-only chunk
        choice = choices[0]
        text = choice.get("text") or ""
        token_ids = choice.get("token_ids") or []
        if text or token_ids:
            t_s = time.perf_counter() - t0
            if rec.first_token_s is None:
                rec.first_token_s = t_s
            # new lists, never changed in place: a mid-run copy of the record stays as it was
            rec.token_times_s = [*rec.token_times_s, *[t_s] * max(1, len(token_ids))]
            pieces.append(text)
            ids.extend(int(i) for i in token_ids)
            rec.output_text += text  # live text for a page; _finish writes the decoded output
        return choice.get("finish_reason")

    def _finish(self, rec: RequestRecord, request: Request, pieces, ids, finish: str) -> None:
        tokenizer = self.loaded.tokenizer
        if self.server_info().returns_token_ids:
            tokens = list(ids)
        else:
            text = "".join(pieces)
            tokens = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
            if finish == "stop" and not (tokens and tokens[-1] in self.eos_token_ids):
                tokens.append(_main_eos(tokenizer, self.eos_token_ids))
        tokens = truncate_at_stop(tokens, request.max_new_tokens, self.eos_token_ids)
        rec.output_token_ids = tokens
        rec.output_text = tokenizer.decode(tokens, skip_special_tokens=True)
        rec.finish_s = rec.token_times_s[-1] if rec.token_times_s else rec.admit_s
        rec.finish_reason = "eos" if finish == "stop" else str(finish)


class ServerRegistry:
    """Server engines by name, in the host's order; other entries (the page's ``Unbuilt``, the
    bench's own engines) are neither local nor started."""

    def __init__(self, engines: Mapping[str, object]):
        self.engines = dict(engines)

    @property
    def names(self) -> list[str]:
        return list(self.engines)

    def server(self, name: str) -> OpenAIEngine | None:
        """The server engine ``name``; None for an entry that is not one."""
        engine = self.engines.get(name)
        return engine if isinstance(engine, OpenAIEngine) else None

    def is_local(self, name: str) -> bool:
        """True for a server this process starts and stops: the local vLLM or llama.cpp's."""
        engine = self.server(name)
        return engine is not None and engine.is_local

    def fits(self, name: str) -> bool:
        """True for a server that takes each run's slots and requests (llama.cpp's)."""
        engine = self.server(name)
        return engine is not None and engine.fits_runs

    def local_names(self) -> list[str]:
        return [name for name in self.engines if self.is_local(name)]

    def check_names(self, names: Iterable[str]) -> list[str]:
        """The chosen server names, in the host's order.

        Raises:
            ValueError: a name the host did not configure (the page takes no addresses).
        """
        chosen = list(dict.fromkeys(names or ()))
        unknown = [n for n in chosen if n not in self.engines]
        if unknown:
            raise ValueError(
                f"No server named {', '.join(map(repr, unknown))} is configured on this page; "
                f"the host configured: {', '.join(self.names) or 'none'}."
            )
        return [n for n in self.engines if n in chosen]

    def start_server(self, name: str, on_progress: Callable[[str], None] | None = None) -> None:
        """Start local server ``name`` (a server that died: its leftovers go first) and probe it;
        a remote endpoint is probed only. Raises what the start or the probe raises
        (``EndpointError``)."""
        engine = self.engines[name]
        if engine.is_local:
            engine.server.stop()
            engine.start(on_progress)
        engine.server_info()

    def close(self) -> None:
        """Stop every server this process started."""
        for name in self.local_names():
            self.engines[name].close()


def late_sends(trace: Trace, name: str) -> list[str]:
    """One line when the client sent a request over ``LATE_SEND_S`` late (a busy host): its outside
    TTFT counts the delay."""
    late = [(r.admit_s - r.arrival_s, r) for r in trace.requests if r.admit_s is not None]
    late = [(delay_s, r) for delay_s, r in late if delay_s > LATE_SEND_S]
    if not late:
        return []
    worst_s, worst = max(late, key=lambda pair: pair[0])
    many = f"{len(late)} requests" if len(late) > 1 else "1 request"
    return [
        f"This host's client sent {many} to {name} late, up to {worst_s:.2f} s after arrival "
        f"(R{worst.request_id}; the host was busy): TTFT from outside counts that "
        "delay; a server's own record counts from the send."
    ]


def _takes_top_k(info: ServerInfo) -> bool:
    """``top_k`` is vLLM's extension: servers with vLLM's ``/version`` take it, others refuse it."""
    return info.version is not None


def _sampling_body(sampling, top_k: bool) -> dict:
    body = {"temperature": sampling.temperature, "seed": sampling.seed}
    if top_k and sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if sampling.top_p < 1:
        body["top_p"] = sampling.top_p
    return body


def _main_eos(tokenizer, eos_token_ids: frozenset[int]) -> int:
    """The EOS id a text-only server most likely stopped at: the tokenizer's, else the lowest."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if eos in eos_token_ids else min(eos_token_ids)
