"""The servers line while a local server starts: a clean "starting…" with its settings and how
long, never the server's raw log lines (vLLM's INFO lines, llama.cpp's load messages)."""

from __future__ import annotations

from types import SimpleNamespace

from engine.host_servers import server_set
from engine.llamacpp.server import LlamaSettings
from engine.page.views import server_view
from engine.peers.endpoints import Endpoint
from engine.peers.openai_engine import OpenAIEngine
from engine.peers.vllm_server import VllmSettings

VLLM_LOG = "INFO 05-02 10:11:12 [gpu_model_runner.py:1234] Loading model weights took 0.25 GB"
LLAMA_LOG = "load_tensors: loading model tensors, this can take a while... (mmap = true)"


class _Local(OpenAIEngine):
    """A local server engine that is never started: its settings are what the line reads."""

    def __init__(self, name: str, settings, fits_runs: bool = False):
        super().__init__(Endpoint(name, "http://127.0.0.1:1"), SimpleNamespace(eos_token_ids=()), 2)
        self.server = SimpleNamespace(settings=settings)
        self.fits_runs = fits_runs


def _starting(log_lines: dict[str, str]) -> server_set.ServerSet:
    """A page's local vLLM and llama.cpp (not started), each starting with its latest log line."""
    vllm = _Local("vllm", VllmSettings("model", "float32", 3))
    llama_settings = LlamaSettings("m.gguf", "f32", "model", 2, cpus="0-1")
    llama = _Local("llamacpp", llama_settings, fits_runs=True)
    servers = server_set.ServerSet({"vllm": vllm, "llamacpp": llama})
    for name, line in log_lines.items():
        servers._set(name, server_set.STARTING, line)
    return servers


def test_a_starting_server_shows_a_clean_status_not_its_log():
    """While vLLM and llama.cpp start, the servers line says "starting vLLM… loading weights" and
    "starting llama.cpp… loading weights" with their settings and seconds, and none of their log
    lines (issue 51, item 11)."""
    line = server_view.servers_markdown(_starting({"vllm": VLLM_LOG, "llamacpp": LLAMA_LOG}))
    assert "**vllm**: starting vLLM… loading weights (compiled · float32 · up to 3" in line, line
    assert "**llamacpp**: starting llama.cpp… loading weights (F32 weights · 2 slots" in line, line
    for raw in ("INFO", "gpu_model_runner", "load_tensors", "mmap"):
        assert raw not in line, f"a raw log line in the servers line: {line}"


def test_a_starting_servers_stage_follows_its_log_in_words():
    """Each log line that names a stage moves the servers line's stage word on; a line that
    names none (a warning, a banner) keeps the last one; and the run's note while it waits for
    the server (``wait_ready``'s progress) says the same words, never the raw line."""
    import threading

    servers = _starting({"vllm": VLLM_LOG})
    steps = (
        ("WARNING 05-02 10:11:13 [cpu.py:224] Triton is not installed.", "loading weights"),
        ("INFO 05-02 10:11:14 [utils.py:347] Using LBHNC KV cache layout.", "sizing the KV cache"),
        ("INFO [core.py:402] init engine (profile, create kv cache, warmup model)", "warming up"),
        ("INFO 05-02 10:11:16 [launcher.py:186] Available routes are:", "opening its API"),
    )
    for raw, stage in steps:
        servers._set("vllm", server_set.STARTING, raw, keep_since=True)
        line = server_view.servers_markdown(servers)
        assert f"starting vLLM… {stage} (" in line, f"after {raw!r}: {line}"
        assert "INFO" not in line and "WARNING" not in line, line
    servers.engines["vllm"].server.running = True
    servers._threads["vllm"] = starting = threading.Thread(
        target=threading.Event().wait, args=(0.3,)
    )
    starting.start()
    notes: list[str] = []
    servers.wait_ready("vllm", notes.append)
    assert notes and all(n.endswith(": opening its API") for n in notes), notes
    assert not any("launcher" in n or "INFO" in n for n in notes), notes


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
