"""The servers a host named at start, by name (``ServerSet``), and where each one stands.

A visitor never types a URL: a public page must not become a proxy to arbitrary addresses. The
host names its servers at start (``server_choice``), the page offers only those names, and no
message shows a server's URL or record address (``ServerSet.public``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.host_servers import server_timings
from engine.peers.endpoints import EndpointError
from engine.peers.openai_engine import OpenAIEngine, ServerRegistry
from engine.peers.server_process import start_stage
from engine.serving.run_control import WAIT_SLICE_S
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
    """A local server whose build is missing here: failed with ``why`` (``MissingBuild.public``)."""

    why: str


class ServerSet(ServerRegistry):
    """The host's server engines by name (``ServerRegistry``), and each one's ``ServerStatus``."""

    def __init__(
        self, engines: dict[str, OpenAIEngine | Unbuilt], log: Callable[[str], None] | None = None
    ):
        """``log(line)`` hears every change of state (``app.py`` prints them)."""
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
        """Seconds until local server ``name`` is ready; 0 once ready or failed, or elsewhere."""
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
        """Each local server's stage ratio kept on this host, by name."""
        keys = {name: key for name in self.engines if (key := self._key(name))}
        ratios = {name: server_timings.kept_step_ratio(key) for name, key in keys.items()}
        return {name: ratio for name, ratio in ratios.items() if ratio is not None}

    def keep_stage_ratios(self, ratios: Mapping[str, float]) -> None:
        """Keep the local servers' ``ratios`` for the next page here."""
        for name, ratio in ratios.items():
            if name in self.engines and (key := self._key(name)):
                server_timings.keep_step_ratio(key, ratio)

    def _key(self, name: str) -> dict | None:
        return server_timings.start_key(self.engines[name].server) if self.is_local(name) else None

    def start(self) -> ServerSet:
        """Start the local servers and probe every endpoint, each in a background thread."""
        for name in self.engines:
            if not self.unbuilt(name):
                self._begin(name)
        return self

    def unbuilt(self, name: str) -> bool:
        return isinstance(self.engines[name], Unbuilt)

    def wait_ready(self, name: str, on_wait: Callable[[str], None]) -> None:
        """Return once ``name`` can take a run, starting a local server that is not running;
        ``on_wait(note)`` hears how far it got every ``WAIT_SLICE_S`` (what it raises ends the
        wait, not the start). Raises EndpointError: it failed to start, or is ``Unbuilt``."""
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
        """``message`` with the server's URL replaced by its name."""
        engine = self.engines[name]
        if self.is_local(name) or self.unbuilt(name):
            return message
        record_url = engine.endpoint.record_url
        if record_url:  # first: the API's URL may begin the record's
            message = message.replace(record_url, f"({name}'s record address)")
        return message.replace(engine.endpoint.url, f"({name}'s address)")

    def public_trace(self, name: str, trace: Trace) -> None:
        """``trace``'s warnings, record source and server facts without the server's addresses."""
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
        failed (the next run starts a dead local server again)."""
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
