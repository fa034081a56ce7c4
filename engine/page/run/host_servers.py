"""The servers a host gave the page: a local vLLM (``app.py --vllm``), llama.cpp's
``llama-server`` as two engines (``--llamacpp``: ``llamacpp``, F32, and ``llamacpp_q4``, the
shipped Q4_1 file) and OpenAI endpoints (``--endpoint``, ``CBP_ENDPOINTS``; with
``--endpoint-record`` or ``CBP_ENDPOINT_RECORDS``, a vLLM serving its record of its steps, drawn
from the inside: ``engine.peers.vllm_engine.RecordedEngine``).

A visitor never types a URL: a public page must not become a proxy to arbitrary addresses. The
host names its servers at start (``configure``), the page offers only those names, and a run looks
its servers up by name. No message shows a server's URL or record address either (``public``): a
host's internal address stays the host's.

``PageServers`` starts the local servers and probes each endpoint in the background as the page
starts, keeping each one's state for the servers line (``engine.page.views.server_view``).
``run_servers`` plays a run's workload at each chosen server after our engines; a server that
fails is reported with its message while the other engines' results are kept.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.kernels import cpu_share
from engine.page.run import server_timings
from engine.peers.endpoints import (
    RECORDS_ENV,
    EndpointError,
    MissingBuild,
    ModelRefused,
    endpoints_from_env,
    parse_endpoints,
    records_from_env,
    with_records,
)
from engine.peers.openai_engine import OpenAIEngine, ServerRegistry
from engine.peers.schedule_comparison import num_shared_prompt_blocks, tally
from engine.peers.server_process import start_stage
from engine.peers.vllm_engine import endpoint_engine
from engine.peers.vllm_server import MAX_MODEL_LEN
from engine.sequence import Request
from engine.serving.run_control import WAIT_SLICE_S, RunStopped
from engine.trace import Trace

BUILT_IN = ("static", "continuous", "hf_continuous", "reference")  # the page's own engine names
LOCAL_VLLM = "vllm"
LLAMACPP_NAMES = ("llamacpp", "llamacpp_q4")  # engine.llamacpp.engines.WEIGHTS' names
CONFIGURED, STARTING, READY, FAILED = "configured", "starting", "ready", "failed"


@dataclass
class ServerStatus:
    """Where one server stands, for the servers line."""

    state: str  # CONFIGURED | STARTING | READY | FAILED
    detail: str = ""  # starting: the server's latest log line; failed: why; ready: its facts
    since_s: float = 0.0  # time.monotonic() when the state began
    stage: str = ""  # starting: the last stage its log named (``server_process.start_stage``)


@dataclass(frozen=True)
class Unbuilt:
    """A local server the host asked for whose build is missing here: listed as failed with
    ``why`` (``MissingBuild.public``: no path, the ``make`` target that builds it), and so is a
    run that asks for it."""

    why: str


class PageServers(ServerRegistry):
    """The page's server engines by name (``ServerRegistry``), and each one's ``ServerStatus``."""

    def __init__(
        self, engines: dict[str, OpenAIEngine | Unbuilt], log: Callable[[str], None] | None = None
    ):
        """``log(line)`` hears every change of state (``app.py`` prints them); an ``Unbuilt``
        server is failed from the start."""
        super().__init__(engines)
        self._log = log or (lambda _line: None)
        self._lock = threading.Lock()
        now = time.monotonic()
        self._status = {
            name: ServerStatus(FAILED, e.why, now)
            if isinstance(e, Unbuilt)
            else ServerStatus(CONFIGURED, since_s=now)
            for name, e in self.engines.items()
        }
        self._threads: dict[str, threading.Thread] = {}
        self._expected_start_s: dict[str, float] = {}  # by name, read once (``server_timings``)

    def status(self, name: str) -> ServerStatus:
        with self._lock:
            return self._status[name]

    def starting(self) -> bool:
        """True while some server is still starting or being probed."""
        with self._lock:
            return any(s.state in (CONFIGURED, STARTING) for s in self._status.values())

    def start_left_s(self, name: str) -> float:
        """Seconds until local server ``name`` is ready, as its starts here go
        (``server_timings``); 0 once ready or failed, and for an endpoint elsewhere."""
        if not self.is_local(name):
            return 0.0
        status = self.status(name)
        if status.state not in (CONFIGURED, STARTING):
            return 0.0
        started_s_ago = time.monotonic() - status.since_s if status.state == STARTING else 0.0
        return server_timings.start_left_s(self.expected_start_s(name), started_s_ago)

    def expected_start_s(self, name: str) -> float:
        """Seconds a start of local server ``name`` takes here (``server_timings``)."""
        with self._lock:
            if name not in self._expected_start_s:
                key = server_timings.start_key(self.engines[name].server)
                self._expected_start_s[name] = server_timings.expected_start_s(key)
            return self._expected_start_s[name]

    def stage_ratios(self) -> dict[str, float]:
        """Each local server's stage ratio kept on this host (``server_timings``), by name."""
        keys = {name: key for name in self.engines if (key := self._key(name))}
        ratios = {name: server_timings.kept_step_ratio(key) for name, key in keys.items()}
        return {name: ratio for name, ratio in ratios.items() if ratio is not None}

    def keep_stage_ratios(self, ratios: Mapping[str, float]) -> None:
        """Keep the local servers' ``ratios`` for the next page here (``server_timings``)."""
        for name, ratio in ratios.items():
            if name in self.engines and (key := self._key(name)):
                server_timings.keep_step_ratio(key, ratio)

    def _key(self, name: str) -> dict | None:
        """Local server ``name``'s key on this host (``server_timings.start_key``); None else."""
        return server_timings.start_key(self.engines[name].server) if self.is_local(name) else None

    def start(self) -> PageServers:
        """Start the local servers and probe every endpoint, each in a background thread (an
        ``Unbuilt`` one stays failed)."""
        for name in self.engines:
            if not self.unbuilt(name):
                self._begin(name)
        return self

    def unbuilt(self, name: str) -> bool:
        """True for a local server whose build is missing here (``Unbuilt``)."""
        return isinstance(self.engines[name], Unbuilt)

    def wait_ready(self, name: str, on_wait: Callable[[str], None]) -> None:
        """Return once ``name`` can take a run; a local server that is not running is started.

        ``on_wait(note)`` is called every ``WAIT_SLICE_S`` while it starts, with a line saying
        how far it got; whatever it raises (``RunStopped``) ends the wait (the start goes on).

        Raises:
            EndpointError: the server failed to start, or its build is missing (``Unbuilt``).
        """
        if self.unbuilt(name):
            raise EndpointError(self.engines[name].why)
        if not self.is_local(name):
            return  # a remote endpoint: its run probes it and says if it cannot be reached
        thread = self._threads.get(name)
        if not self.engines[name].server.running and not (thread and thread.is_alive()):
            thread = self._begin(name)
        while thread is not None and thread.is_alive():
            status = self.status(name)  # its stage in words, never its raw log line
            stage = f": {status.stage}" if status.stage else ""
            on_wait(f"starting the server ({time.monotonic() - status.since_s:.0f} s){stage}")
            thread.join(WAIT_SLICE_S)
        status = self.status(name)
        if status.state == FAILED:
            raise EndpointError(status.detail)

    def public(self, name: str, message: str) -> str:
        """``message`` with the server's URL replaced by its name (see the module docstring)."""
        engine = self.engines[name]
        if self.is_local(name) or self.unbuilt(name):
            return message
        record_url = engine.endpoint.record_url
        if record_url:  # first: the API's URL may begin the record's
            message = message.replace(record_url, f"({name}'s record address)")
        return message.replace(engine.endpoint.url, f"({name}'s address)")

    def public_trace(self, name: str, trace: Trace) -> None:
        """``trace``'s warnings, record source and server facts without the server's addresses
        (``public``)."""
        trace.warnings = [self.public(name, line) for line in trace.warnings]
        for key in ("schedule_record", "server"):
            found = trace.info.get(key)
            if isinstance(found, dict):
                kept = {
                    k: self.public(name, v) if isinstance(v, str) else v for k, v in found.items()
                }
                trace.info = {**trace.info, key: kept}

    def refresh(self, name: str, error: str | None = None) -> None:
        """After a run on ``name`` (``error``: why it failed): ready if it still answers, else
        failed (a local vLLM that died is started again by the next run); an ``Unbuilt`` one
        stays failed."""
        if self.unbuilt(name):
            return
        engine = self.engines[name]
        alive = engine.server.running if self.is_local(name) else engine.probed is not None
        if alive:
            self._set(name, READY, "")
        elif error is not None:
            self._set(name, FAILED, error)

    def _begin(self, name: str) -> threading.Thread:
        with self._lock:
            thread = self._threads.get(name)
            if thread is not None and thread.is_alive():
                return thread
            thread = threading.Thread(
                target=self._prepare, args=(name,), name=f"cbp-server-{name}", daemon=True
            )
            self._threads[name] = thread
            self._status[name] = ServerStatus(STARTING, "", time.monotonic())
        thread.start()
        return thread

    def _prepare(self, name: str) -> None:
        """Start (local) or probe (remote) one server; its status says how it went."""
        what = "starting the server" if self.is_local(name) else "asking what it serves"
        self._log(f"{name}: {what}")
        try:
            self.start_server(name, lambda line: self._set(name, STARTING, line, keep_since=True))
        except Exception as exc:  # noqa: BLE001  (any failure is the server's state to show)
            message = self.public(name, str(exc) or type(exc).__name__)
            self._set(name, FAILED, message)
            self._log(f"{name}: failed: {message}")
            return
        if self.is_local(name):
            self._keep_start(name)
        self._set(name, READY, "")
        self._log(f"{name}: ready")

    def _keep_start(self, name: str) -> None:
        """Keep the start just measured, for the queue's estimates now and after a restart."""
        server = self.engines[name].server
        if server.start_s:
            with self._lock:
                self._expected_start_s[name] = server.start_s
            server_timings.keep_start(server_timings.start_key(server), server.start_s)

    def _set(self, name: str, state: str, detail: str, keep_since: bool = False) -> None:
        with self._lock:
            before = self._status[name]
            since_s = before.since_s if keep_since else time.monotonic()
            stage = before.stage if before.state == state == STARTING else ""
            stage = (start_stage(detail) if state == STARTING else None) or stage
            self._status[name] = ServerStatus(state, detail, since_s, stage)


def configure(
    loaded,
    endpoint_items: Iterable[str] = (),
    environ=None,
    *,
    vllm: bool = False,
    vllm_eager: bool = False,
    vllm_max_num_seqs: int = 3,
    vllm_max_model_len: int = MAX_MODEL_LEN,
    log: Callable[[str], None] | None = None,
    record_items: Iterable[str] = (),
    llamacpp: bool = False,
    cpus: tuple[int, ...] | None = None,
) -> PageServers:
    """The page's servers: the local vLLM if ``vllm``, the llama.cpp engines if ``llamacpp``,
    then ``--endpoint`` items, then ``CBP_ENDPOINTS``. The local vLLM runs ``--max-num-seqs
    vllm_max_num_seqs`` and ``--max-model-len vllm_max_model_len`` (both fixed at start).
    ``record_items``: ``--endpoint-record NAME=RECORD_URL`` entries, then
    ``CBP_ENDPOINT_RECORDS``'s, for endpoints of either kind. A local server whose build is
    missing (no ``.venv-vllm``: ``make vllm``; no ``llama-server``: ``make llamacpp``) is
    ``Unbuilt`` (``log`` hears the path looked at): no reason to stop the page. ``cpus``: the
    CPUs the local servers compute on, one thread each: our engines' (None: every CPU), so each
    engine of a run gets the same CPUs and threads.

    Raises:
        ValueError: a bad or repeated endpoint, a built-in engine's name, no GGUF for
            llama.cpp, a local vLLM's model with no folder or hub id, or a bad record entry (one
            for a name no endpoint has).
    """
    log = log or (lambda _line: None)
    engines: dict[str, OpenAIEngine | Unbuilt] = {}
    reserved = set(BUILT_IN)
    bind = None if cpus is None else ",".join(map(str, cpus))
    if vllm:
        from engine.peers.vllm_engine import VllmEngine

        make = functools.partial(
            VllmEngine, loaded, vllm_max_num_seqs, enforce_eager=vllm_eager,
            max_model_len=vllm_max_model_len, cpus=bind,
        )  # fmt: skip
        engines[LOCAL_VLLM] = _built(LOCAL_VLLM, make, log)
        reserved.add(LOCAL_VLLM)
    if llamacpp:
        engines |= _llamacpp_engines(loaded, vllm_max_num_seqs, log, bind)
        reserved |= set(LLAMACPP_NAMES)
    flagged = parse_endpoints(endpoint_items, reserved)
    from_env = endpoints_from_env(environ, reserved)
    for endpoint in from_env:
        if endpoint.name in {e.name for e in flagged}:
            raise ValueError(
                f"CBP_ENDPOINTS entry {endpoint.name!r}: the name is already used by another "
                "endpoint (--endpoint); pick another name."
            )
    found = with_records([*flagged, *from_env], record_items)
    found = with_records(found, records_from_env(environ), f"{RECORDS_ENV} entry")
    for endpoint in found:
        engines[endpoint.name] = endpoint_engine(endpoint, loaded, vllm_max_num_seqs)
    return PageServers(engines, log)


def _built(name: str, make: Callable[[], OpenAIEngine], log) -> OpenAIEngine | Unbuilt:
    """``make()``, or ``Unbuilt`` when it raises ``MissingBuild`` (said in ``log``, with the
    path) or ``ModelRefused`` (the server cannot serve this model: the page starts anyway)."""
    try:
        return make()
    except (MissingBuild, ModelRefused) as exc:  # each says it without the host's path: public
        log(f"{name}: failed: {exc}")
        return Unbuilt(exc.public)


def _llamacpp_engines(loaded, num_slots: int, log: Callable[[str], None], cpus=None) -> dict:
    """``llamacpp`` (the loaded weights as an F32 GGUF, converted once: about 30 s) and, for
    the embedded model, ``llamacpp_q4`` (its shipped Q4_1 file); another model gets ``llamacpp``
    alone, said in ``log``. Without ``make llamacpp``'s build each is ``Unbuilt``.

    Raises:
        ValueError: the F32 file cannot be made (no local safetensors folder); a converter
            that fails on the model lists ``llamacpp`` as failed (``ModelRefused``).
    """
    from engine.llamacpp.engines import LlamaCppEngine, gguf_for

    log("llamacpp: the F32 GGUF of the loaded weights (converted on first use, about 30 s)")
    f32 = functools.partial(LlamaCppEngine, loaded, num_slots, cpus=cpus)
    engines = {"llamacpp": _built("llamacpp", f32, log)}
    try:
        gguf_for(loaded, "q4_1")  # the embedded model's shipped file, or why there is none
    except ValueError as exc:
        log(f"llamacpp_q4: not offered: {exc}")
        return engines
    q4 = functools.partial(LlamaCppEngine, loaded, num_slots, name="llamacpp_q4", cpus=cpus)
    engines["llamacpp_q4"] = _built("llamacpp_q4", q4, log)
    return engines


def run_servers(
    servers: PageServers,
    names: list[str],
    requests: list[Request],
    config: EngineConfig,
    watch,
    dtype: str | None = None,
) -> tuple[dict[str, Trace], dict[str, str]]:
    """Run ``requests`` on each server in ``names``: (traces, failures), both by name.

    ``watch`` is ``engine.worker.progress.ProgressLog.watch``. A failure's message says what
    went wrong for a person; after a stop (Stop, the time limit) the server's streams are
    cancelled, and the servers not run yet are listed as not run, with the reason. ``config``
    (its slots, batch-invariant mode and prefix caching) and ``dtype`` are our engines' run
    settings: a local server fixed otherwise at its start says so in its trace's warnings.
    """
    num_slots = config.num_slots
    traces: dict[str, Trace] = {}
    failures: dict[str, str] = {}
    for i, name in enumerate(names):
        streaming = []  # not empty once its streams began
        try:
            watched = functools.partial(watch, name)
            trace = _run_one(servers, name, requests, num_slots, watched, streaming)
        except EndpointError as exc:
            failures[name] = servers.public(name, str(exc))
            servers.refresh(name, failures[name])
            continue
        except RunStopped as exc:
            done = "Its streams were cancelled." if streaming else "It had not started streaming."
            failures[name] = f"stopped: {exc} {done}"
            failures.update(dict.fromkeys(names[i + 1 :], f"not run: {exc}"))
            break
        servers.refresh(name)
        servers.public_trace(name, trace)
        precision = _precision_warnings(servers, name, trace, dtype, config.batch_invariant)
        unlike = [*_slot_warnings(servers, name, num_slots), *precision]
        unlike += _prefix_warnings(servers, name, config.prefix_caching, requests, trace)
        trace.warnings = [*trace.warnings, *unlike]
        watch(name, trace, done=True)
        traces[name] = trace
    return traces, failures


def _run_one(
    servers: PageServers, name: str, requests, num_slots: int, watch, streaming: list
) -> Trace:
    """One server's run; ``watch`` is ``ProgressLog.watch`` for this server's name. A server that
    fits each run (``PageServers.fits``) gets ``num_slots`` and ``requests`` first. ``streaming``
    gets an item when the streams begin (a stop after that cancels them)."""
    watch(None, waiting=True, note="waiting for the server")
    on_wait = lambda note: watch(None, waiting=True, note=note)  # noqa: E731
    servers.wait_ready(name, on_wait)
    if servers.fits(name) and servers.engines[name].fit(requests, num_slots):
        servers.wait_ready(name, on_wait)  # it starts again with this run's settings
    streaming.append(True)
    engine = servers.engines[name]
    with _other_work(servers, name) as others:
        trace = engine.run(requests, on_wait=lambda t: watch(t, waiting=True))
    trace.info["others_cpu_share"] = others.share

    trace.warnings = [*trace.warnings, *cpu_share.load_warning(name, others.share)]
    return trace


def _other_work(servers: PageServers, name: str):
    """Measures other work's share of a local server's CPUs beside its own process group's; an
    endpoint elsewhere is not measured (its ``share`` stays None)."""
    server = servers.engines[name].server if servers.is_local(name) else None
    if server is None or server.proc is None:
        return contextlib.nullcontext(cpu_share.OtherWork())
    return cpu_share.OtherWork(cpus=server.cpus(), group=server.proc.pid)


def _slot_warnings(servers: PageServers, name: str, num_slots: int) -> list[str]:
    """The local vLLM's sequences are fixed at start: say so when the run has other slots."""
    if not servers.is_local(name) or servers.fits(name):
        return []
    max_num_seqs = servers.engines[name].server.settings.max_num_seqs
    if max_num_seqs == num_slots:
        return []
    sequences = "sequence" if max_num_seqs == 1 else "sequences"
    slots = "1 slot" if num_slots == 1 else f"{num_slots} slots"
    return [
        f"{name} runs up to {max_num_seqs} {sequences} at once (--max-num-seqs, fixed when the "
        f"page started; app.py --vllm-max-num-seqs changes it), while this run gave our engines "
        f"{slots}: the comparison is not like for like."
    ]


def _prefix_warnings(
    servers: PageServers,
    name: str,
    prefix_caching: bool | None,
    requests: list[Request],
    trace: Trace,
) -> list[str]:
    """The local vLLM's prefix caching is fixed at start (on, vLLM's default, unless the page
    turned it off): say so when the run's engines did otherwise and it changes the comparison:
    the run's prompts share full KV blocks (of vLLM's block size, from its own record in
    ``trace.schedule`` or its settings; unknown: 16, its smallest default), or its record shows
    prefix-cache hits (the client's ``trace`` has no steps)."""
    if not servers.is_local(name) or servers.fits(name) or prefix_caching is None:
        return []
    settings = servers.engines[name].server.settings
    served = settings.prefix_caching is not False
    if served == prefix_caching:
        return []
    record = trace.schedule or Trace(engine=name, num_slots=0)
    block_size = record.info.get("block_size") or settings.block_size or 16
    num_shared = num_shared_prompt_blocks(requests, block_size)
    num_hits = tally(record).num_prefix_hits
    if not num_shared and not num_hits:
        return []
    theirs, ours = ("caches", "did not") if served else ("does not cache", "did")
    blocks = f"{num_shared} block{'s' * (num_shared != 1)} of {block_size} tokens"
    why = f"this run's prompts share {blocks}"
    if num_hits:
        why = f"{num_hits} of its admissions started from cached blocks"
    return [
        f"{name} {theirs} prompt prefixes (fixed when the page started), while this run's "
        f"engines {ours} (the prefix caching setting), and {why}: its time to first token and "
        "its plans differ for that reason, not for its scheduler."
    ]


def _precision_warnings(
    servers: PageServers, name: str, trace: Trace, dtype: str | None, batch_invariant: bool
) -> list[str]:
    """The local server's dtype is fixed at start: when the run has another, say so and record
    both in ``trace.info["server"]`` (``dtype``, ``run_dtype``: its outputs are then not compared,
    ``engine.page.views.tables.not_compared_why``); in batch-invariant mode, say that the server
    does not run in it."""
    if not servers.is_local(name) or dtype is None:
        return []
    served = servers.engines[name].server.settings.dtype
    trace.info["server"] = {**trace.info.get("server", {}), "dtype": served, "run_dtype": dtype}
    lines = []
    fixed_by = "fixed when the page started; app.py --dtype sets it"
    if servers.fits(name):
        fixed_by = "llama.cpp computes in it, whatever the weights"
    if served != dtype:
        lines.append(
            f"{name} runs in {served} ({fixed_by}), "
            f"while this run ran our engines in {dtype}: its outputs are not compared with the "
            "reference, which is in the run's precision."
        )
    if batch_invariant:
        lines.append(
            f"{name} does not run in batch-invariant mode: its outputs depend on the batch, and "
            "its wall time is not that of our engines in that mode."
        )
    return lines
