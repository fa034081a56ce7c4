"""The servers line while a local server starts: a clean "starting…" with its settings and how
long, never the server's raw log lines (vLLM's INFO lines, llama.cpp's load messages)."""

from __future__ import annotations

from types import SimpleNamespace

from engine.llamacpp.server import LlamaSettings
from engine.page.run import host_servers
from engine.page.views import server_view
from engine.peers.vllm_server import VllmSettings

VLLM_LOG = "INFO 05-02 10:11:12 [gpu_model_runner.py:1234] Loading model weights took 0.25 GB"
LLAMA_LOG = "load_tensors: loading model tensors, this can take a while... (mmap = true)"


def _starting(log_lines: dict[str, str]) -> host_servers.PageServers:
    """A page's local vLLM and llama.cpp (not started), each starting with its latest log line."""
    vllm = SimpleNamespace(server=SimpleNamespace(settings=VllmSettings("model", "float32", 3)))
    llama_settings = LlamaSettings("m.gguf", "f32", "model", 2, cpus="0-1")
    llama = SimpleNamespace(server=SimpleNamespace(settings=llama_settings), fit=None)
    servers = host_servers.PageServers({"vllm": vllm, "llamacpp": llama})
    for name, line in log_lines.items():
        servers._set(name, host_servers.STARTING, line)
    return servers


def test_a_starting_server_shows_a_clean_status_not_its_log():
    """While vLLM and llama.cpp start, the servers line says "starting vLLM…" and "starting
    llama.cpp…" with their settings and seconds, and none of their log lines (issue 51, item 11)."""
    line = server_view.servers_markdown(_starting({"vllm": VLLM_LOG, "llamacpp": LLAMA_LOG}))
    assert "**vllm**: starting vLLM… (compiled · float32 · up to 3 sequences" in line, line
    assert "**llamacpp**: starting llama.cpp… (F32 weights · 2 slots" in line, line
    for raw in ("INFO", "gpu_model_runner", "load_tensors", "mmap"):
        assert raw not in line, f"a raw log line in the servers line: {line}"


def test_the_empty_server_charts_name_the_box_as_it_is_labelled():
    """ "tick one under …" in the empty server and inside charts quotes the servers' checkbox
    label as the page shows it ("Also run on the host's servers"), where it said "Also run on
    servers", a box the page does not have (issue 51, item 11)."""
    from engine.page.figures import server_lanes
    from engine.page.panels import server_panels
    from engine.page.views import inside_view

    label = server_panels.servers_checkbox(["vllm"]).label
    for message in (server_lanes.NO_SERVER, inside_view.NO_SERVER):
        quoted = message.split("“")[1].split("”")[0]
        assert label.startswith(quoted), f"{quoted!r} is not the box's label {label!r}"
