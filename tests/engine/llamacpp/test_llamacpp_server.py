"""``LlamaServer``'s faults, each with a message a person can act on: a missing or broken
binary, a port in use, a server that dies mid-run."""

from __future__ import annotations

import socket

import pytest

from engine.llamacpp.engines import LlamaCppEngine
from engine.llamacpp.gguf_file import q4_gguf
from engine.llamacpp.server import LlamaServer, settings_for
from engine.peers.endpoints import EndpointError, MissingBuild
from engine.workloads.workload import RequestSpec
from tests.engine.llamacpp.conftest import short_requests
from tests.live_servers import needs_llamacpp


def _settings():
    return settings_for(q4_gguf(), "q4_1", "smollm2-135m-instruct", 1)


def test_missing_binary_is_refused_with_the_build_command(tmp_path):
    """A server binary that is not there is refused before anything starts, naming
    ``make llamacpp``: for the console with the path, for the page without it."""
    with pytest.raises(MissingBuild, match="make llamacpp") as caught:
        LlamaServer(_settings(), binary=tmp_path / "llama-server")
    assert str(tmp_path) in str(caught.value), "the console message lost the path looked at"
    assert caught.value.public.startswith("no llama-server here; build it with `make llamacpp`")
    assert str(tmp_path) not in caught.value.public, "the page's message shows the host's path"


def test_binary_that_exits_at_once_says_its_exit_code():
    """A binary that exits while starting raises EndpointError with its exit code."""
    server = LlamaServer(_settings(), binary="/bin/false")
    with pytest.raises(EndpointError, match="exited with code 1 while starting"):
        server.start(timeout_s=30)
    assert not server.running


@needs_llamacpp
def test_port_in_use_is_named():
    """A port another program listens on gives an error that says the port is in use."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = LlamaServer(_settings(), port=port)
        with pytest.raises(EndpointError, match=f"127.0.0.1:{port}: the port is in use"):
            server.start(timeout_s=60)
    assert not server.running


@needs_llamacpp
@pytest.mark.real_model
def test_server_dying_mid_run_says_so(embedded_model):
    """A server killed during a run raises EndpointError saying it exited during the run, with
    the partial trace attached."""
    spec = RequestSpec("1, 2, 3, 4, 5, 6, 7, 8,", 1500)  # counts on for many seconds
    requests = short_requests(embedded_model, [spec])
    engine = LlamaCppEngine(embedded_model, 1, name="llamacpp_q4", requests=requests)

    def kill_after_first_token(trace):
        if any(r.first_token_s is not None for r in trace.requests):
            engine.server.kill()

    try:
        with pytest.raises(EndpointError, match="exited with code -9 during a run") as info:
            engine.run(requests, on_wait=kill_after_first_token)
    finally:
        engine.close()
    trace = info.value.trace
    assert trace is not None and trace.requests[0].first_token_s is not None, "no partial trace"
