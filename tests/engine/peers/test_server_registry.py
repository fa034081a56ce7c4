"""One server registry for the page and the bench: a typed interface (``OpenAIEngine.is_local``,
``start``, ``close``, ``probed``, ``matched_to``) instead of duck typing, and the server flags
declared once for both command lines."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.bench.args import parse_args as bench_args
from engine.llamacpp.engines import LlamaCppEngine
from engine.page.host.launch import parse_args as page_args
from engine.peers.endpoints import Endpoint, EndpointError
from engine.peers.openai_engine import OpenAIEngine, ServerRegistry
from engine.peers.server_process import ServerProcess
from tests.live_servers import free_port, needs_llamacpp

ENGINE = Path(__file__).resolve().parents[3] / "engine"
SERVER_USERS = (
    "bench/servers.py",
    "host_servers/server_set.py",
    "host_servers/server_choice.py",
    "host_servers/server_runs.py",
)
SERVER_FLAGS = ("--endpoint", "--endpoint-record", "--vllm-eager")


def test_a_remote_endpoint_is_neither_started_nor_stopped(embedded_model):
    """A remote endpoint is not local and takes no run's slots; starting it probes it (an
    unreachable one raises ``EndpointError``); close leaves it alone; names keep the host's
    order and an unknown one is refused."""
    url = f"http://127.0.0.1:{free_port()}"
    gone = OpenAIEngine(Endpoint("gone", url), embedded_model, 2)
    registry = ServerRegistry({"gone": gone, "static": object()})
    assert not registry.is_local("gone") and not registry.fits("gone")
    assert registry.server("static") is None and registry.local_names() == []
    with pytest.raises(EndpointError):
        registry.start_server("gone")
    assert gone.probed is None and gone.matched_to is None and gone.unmatched == []
    registry.close()
    assert registry.check_names(["gone"]) == ["gone"]
    with pytest.raises(ValueError, match="No server named 'elsewhere'"):
        registry.check_names(["elsewhere"])


@needs_llamacpp
def test_a_local_server_is_started_probed_and_stopped(embedded_model):
    """llama.cpp's Q4 engine is local and fits each run: the registry starts its real server,
    which answers the probe, and stops it on close."""
    engine = LlamaCppEngine(embedded_model, 1, name="llamacpp_q4")
    registry = ServerRegistry({"llamacpp_q4": engine})
    assert registry.local_names() == ["llamacpp_q4"] and registry.fits("llamacpp_q4")
    try:
        registry.start_server("llamacpp_q4")
        assert engine.server.running and engine.probed is not None, "not started and probed"
    finally:
        registry.close()
    assert not engine.server.running, "close left the server running"


HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


class _HealthServer(ServerProcess):
    """A real process that answers ``/health``: the part every local server shares."""

    NAME = "health server"
    POLL_S = 0.05

    def command(self) -> list[str]:
        return [sys.executable, "-c", HEALTH_SERVER, str(self.port)]


def test_any_engine_that_owns_a_server_timings_and_stops_it():
    """``OpenAIEngine.start`` starts the server process the engine owns (again after it died,
    probing afresh) and ``close`` stops it, with no subclass restating either."""
    engine = OpenAIEngine(
        Endpoint("local", "http://127.0.0.1:1"), SimpleNamespace(eos_token_ids=()), 1
    )
    engine.server = _HealthServer()
    try:
        assert engine.start() is engine and engine.server.running, "start did not start it"
        first = engine.server.proc.pid
        engine.server.stop()
        engine._info = "probed before it died"
        engine.start()
        assert engine.server.running and engine.server.proc.pid != first, "not started again"
        assert engine._info is None, "a restarted server keeps the old probe"
    finally:
        engine.close()
    assert not engine.server.running, "close left the server running"


def test_the_page_and_the_bench_read_server_flags_alike():
    """The same server flags give the page and the bench the same values."""
    argv = ["--endpoint", "a=http://x:1", "--endpoint-record", "a=http://x:2", "--vllm-eager"]
    page, bench = page_args(argv), bench_args(["--engines", "static", *argv])
    for name in ("endpoint", "endpoint_record", "vllm_eager"):
        assert getattr(page, name) == getattr(bench, name), f"{name} differs"


def _declared(tree: ast.AST) -> list[str]:
    """The flags ``tree``'s ``add_argument`` calls declare."""
    return [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", "") == "add_argument"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]


def test_server_flags_are_declared_once():
    """Each server flag is declared (``add_argument``) in one module of ``engine/``."""
    found = {flag: [] for flag in SERVER_FLAGS}
    for path in sorted(ENGINE.rglob("*.py")):
        declared = _declared(ast.parse(path.read_text(encoding="utf-8")))
        for flag in SERVER_FLAGS:
            if flag in declared:
                found[flag].append(path.relative_to(ENGINE).as_posix())
    assert all(len(where) == 1 for where in found.values()), found


def test_no_duck_typing_of_server_engines():
    """The bench's and the page's server modules ask no engine ``getattr`` or ``hasattr``."""
    found = []
    for name in SERVER_USERS:
        tree = ast.parse((ENGINE / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                "getattr",
                "hasattr",
            ):
                found.append(f"{name}:{node.lineno}")
    assert not found, f"duck typing: {found}"
