"""The host's servers on the page: configured by flag or environment only, offered by name only.

No server needs to answer here: these tests check the configuration, the page's controls (a
checkbox per configured server, never a box for an address), the servers line, and local servers
that cannot start (a Python without vLLM, a build that is missing), which a run reports while
keeping the other engines.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import gradio as gr
import pytest

from engine.host_servers import server_choice, server_set
from engine.host_servers.server_choice import ServerChoice
from engine.page.handlers import playground
from engine.page.host import launch
from engine.page.run import run_options, shared_model
from engine.page.views import run_view, server_view
from tests.live_servers import free_port, needs_vllm

OUT = {name: i for i, name in enumerate(run_view.RUN_OUTPUTS)}
ROWS = [["hello world", 4], ["abc", 3]]


def _run(rows, names):
    events = playground.run_event(
        rows, 2, False, True, "paged", 0, "decode_first", False, 0, "time", server_names=names
    )
    return dict(zip(run_view.RUN_OUTPUTS, list(events)[-1], strict=True))


@pytest.fixture
def page(shared, monkeypatch):
    """The tiny shared model as the page's, its servers cleared after the test."""
    monkeypatch.setattr(shared_model, "_shared_model", shared)
    yield shared
    shared.servers = None


def test_endpoints_come_from_flags_then_the_environment(shared):
    """--endpoint items first, then CBP_ENDPOINTS; URLs to their root; names as given."""
    env = {"CBP_ENDPOINTS": "gpu=http://10.0.0.5:8000/v1"}
    found = server_choice.build(
        shared.worker.model.loaded,
        ServerChoice(endpoint=("mine=http://127.0.0.1:8001/",)),
        environ=env,
    )
    assert found.names == ["mine", "gpu"]
    assert [e.endpoint.url for e in found.engines.values()] == [
        "http://127.0.0.1:8001",
        "http://10.0.0.5:8000",
    ]


@pytest.mark.parametrize(
    ("items", "env", "message"),
    [
        (["continuous=http://h:1"], "", "already used by a built-in engine"),
        (["a=http://h:1"], "a=http://h:2", "already used by another endpoint"),
        (["gpu"], "", "write it as NAME=URL"),
        ([], "x=ftp://h:1", "CBP_ENDPOINTS entry"),
    ],
)
def test_bad_server_configuration_is_refused(shared, items, env, message):
    """A built-in name, a repeated name, a malformed entry: refused at start, saying which."""
    with pytest.raises(ValueError, match=message):
        server_choice.build(
            shared.worker.model.loaded,
            ServerChoice(endpoint=tuple(items)),
            environ={"CBP_ENDPOINTS": env},
        )


def test_an_endpoint_with_a_record_reads_it_and_hides_its_address(shared):
    """--endpoint-record, or CBP_ENDPOINT_RECORDS, gives that endpoint (flagged or from
    CBP_ENDPOINTS) an engine that reads its record there; the page's messages name both
    addresses instead of showing them; a record for a name no endpoint has is refused."""
    env = {"CBP_ENDPOINTS": "gpu=http://10.0.0.5:8000"}
    records = ["gpu=http://10.0.0.5:8100", "mine=http://127.0.0.1:8001/record"]
    found = server_choice.build(
        shared.worker.model.loaded,
        ServerChoice(endpoint=("mine=http://127.0.0.1:8001",), endpoint_record=tuple(records)),
        environ=env,
    )
    feeds = {name: getattr(e, "record", None) for name, e in found.engines.items()}
    assert feeds["gpu"].url == "http://10.0.0.5:8100/record", feeds
    assert feeds["mine"].url == "http://127.0.0.1:8001/record", feeds
    said = found.public("mine", "The record at http://127.0.0.1:8001/record needs a token")
    assert said == "The record at (mine's record address) needs a token", said
    said = found.public("gpu", "http://10.0.0.5:8000 and http://10.0.0.5:8100/record")
    assert said == "(gpu's address) and (gpu's record address)/record", said
    with pytest.raises(ValueError, match="no endpoint is named 'tpu'"):
        server_choice.build(
            shared.worker.model.loaded,
            ServerChoice(endpoint_record=("tpu=http://h:1",)),
            environ=env,
        )
    by_env = {**env, "CBP_ENDPOINT_RECORDS": "gpu=http://10.0.0.5:8100,"}
    from_env = server_choice.build(
        shared.worker.model.loaded, ServerChoice(), environ=by_env
    ).engines["gpu"]
    assert from_env.record.url == "http://10.0.0.5:8100/record", "CBP_ENDPOINT_RECORDS unread"
    with pytest.raises(ValueError, match="CBP_ENDPOINT_RECORDS entry 'x'"):
        server_choice.build(
            shared.worker.model.loaded, ServerChoice(), environ={**env, "CBP_ENDPOINT_RECORDS": "x"}
        )
    assert launch.parse_args(["--endpoint-record", "a=http://h:1"]).endpoint_record == [
        "a=http://h:1"
    ]


@pytest.mark.parametrize(
    ("flag", "env", "missing"),
    [
        ("vllm", "CBP_VLLM_VENV", "no vLLM here"),
        ("llamacpp", "CBP_LLAMACPP_DIR", "no llama-server here"),
    ],
)
def test_a_server_not_built_is_failed_on_the_page(page, tmp_path, monkeypatch, flag, env, missing):
    """--vllm without .venv-vllm, --llamacpp without llama-server: the page starts anyway; the
    servers line lists the server as failed with the make target that builds it (the path looked
    at goes to the log only), and a run that asks for it says so while static and continuous are
    shown as usual. A typo in --endpoint beside it still stops the start."""
    monkeypatch.setenv(env, str(tmp_path / "missing"))
    loaded, logged = _with_source(page.worker.model.loaded, tmp_path), []
    page.servers = server_choice.build(loaded, ServerChoice(**{flag: True}), logged.append).start()
    assert page.servers.names == [flag], "llamacpp_q4 is the embedded model's only"
    assert page.servers.status(flag).state == server_set.FAILED and not page.servers.starting()
    line = server_view.servers_markdown(page.servers)
    said = f"**{flag}**: ✗ {missing}; build it with \\`make {flag}\\`"
    assert line.startswith(f"**Servers** · {said}"), line
    assert str(tmp_path) not in line, "the host's path is on the page"
    assert any(str(tmp_path / "missing") in entry for entry in logged), logged
    with pytest.warns(UserWarning, match=f"{missing}; build it with `make {flag}`"):
        final = _run(ROWS, [flag])
    status = final["status_markdown"]
    assert f"**✗ {flag}:** {missing}; build it with \\`make {flag}\\`" in status, status
    assert "The other engines' results are kept." in status, status
    assert list(final["run_state"].traces()) == ["static", "continuous"]
    assert "✓ all match" in status, status
    with pytest.raises(ValueError, match="write it as NAME=URL"):
        server_choice.build(loaded, ServerChoice(endpoint=("gpu",), **{flag: True}))


def test_command_line_flags():
    """app.py's server flags: --vllm and its settings, and a repeated --endpoint."""
    args = launch.parse_args(
        ["--vllm", "--vllm-eager", "--vllm-max-num-seqs", "8", "--vllm-max-model-len", "512"]
        + ["--endpoint", "a=http://h:1", "--endpoint", "b=http://h:2"]
    )
    assert (args.vllm, args.vllm_eager, args.vllm_max_num_seqs) == (True, True, 8)
    assert args.vllm_max_model_len == 512
    assert args.endpoint == ["a=http://h:1", "b=http://h:2"]
    plain = launch.parse_args([])
    assert (plain.vllm, plain.endpoint, plain.vllm_max_num_seqs) == (False, [], 3)
    assert plain.vllm_max_model_len == 2048


def test_the_page_offers_names_and_no_address_box():
    """Configured servers are checkboxes, none ticked (a default Run waits for no server, issue
    51 item 5), and the box says what ticking one costs; no text box on the page takes input."""
    import app

    demo = app.build_demo("Model: test", ["gpu", "vllm"])
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    box = by_id["servers_checkbox"]
    assert [c[1] for c in box.choices] == ["gpu", "vllm"], box.choices
    assert box.value == [], f"servers ticked by default: every first Run waits for {box.value}"
    assert "everyone in line after you" in box.info, f"the box hides what a tick costs: {box.info}"
    assert box.visible and by_id["servers_markdown"].visible
    typing = [b for b in demo.blocks.values() if isinstance(b, gr.Textbox) and b.interactive]
    assert typing == [], f"text boxes a visitor can type into: {[b.elem_id for b in typing]}"
    run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    # after the handle: the servers, then the precision (dtype, batch-invariant), appended later
    servers = run_options.RUN_INPUTS.index("server_names")
    assert run_options.RUN_INPUTS[servers - 1] == "handle", (
        "the servers no longer follow the handle"
    )
    assert run.inputs[servers] is box, "the servers are not the Run event's input after the handle"
    bare = app.build_demo("Model: test")
    bare_ids = {b.elem_id: b for b in bare.blocks.values() if getattr(b, "elem_id", None)}
    assert not bare_ids["servers_checkbox"].visible and not bare_ids["servers_markdown"].visible


def test_a_run_takes_only_configured_names(page):
    """An API client's URL or unknown name is refused before anything runs."""
    with pytest.warns(UserWarning, match="no servers configured"):
        final = _run(ROWS, ["http://127.0.0.1:9"])
    assert "**Not run:** This page has no servers configured" in final["status_markdown"]
    page.servers = server_choice.build(
        page.worker.model.loaded, ServerChoice(endpoint=(f"gone=http://127.0.0.1:{free_port()}",))
    )
    with pytest.warns(UserWarning, match="No server named"):
        final = _run(ROWS, ["http://evil.example:80"])
    status = final["status_markdown"]
    assert "**Not run:** No server named 'http://evil.example:80' is configured" in status, status
    assert final["run_state"] == gr.skip(), "a refused run changed the page's run"


def test_unreachable_endpoint_in_the_servers_line(page):
    """The servers line says an endpoint cannot be reached, naming it but not its address."""
    url = f"http://127.0.0.1:{free_port()}"
    page.servers = server_choice.build(
        page.worker.model.loaded, ServerChoice(endpoint=(f"gone={url}",))
    ).start()
    _wait_started(page.servers)
    line = server_view.servers_markdown(page.servers)
    assert line.startswith("**Servers** · **gone**: ✗ Cannot reach gone at (gone's address)"), line
    assert url not in line


def test_vllm_that_cannot_start_is_reported_and_the_rest_kept(page, tmp_path, monkeypatch):
    """A local vLLM that exits at start: ✗ in the servers line, and a run that asks for it
    shows why while static and continuous are shown as usual."""
    monkeypatch.setenv("CBP_VLLM_VENV", str(Path(sys.executable).parent.parent))  # no vLLM
    loaded = _with_source(page.worker.model.loaded, tmp_path)
    page.servers = server_choice.build(loaded, ServerChoice(vllm=True, vllm_eager=True)).start()
    _wait_started(page.servers)
    line = server_view.servers_markdown(page.servers)
    assert "**vllm**: ✗ vLLM exited with code" in line, line
    with pytest.warns(UserWarning, match="vLLM exited with code"):
        final = _run(ROWS, ["vllm"])
    status = final["status_markdown"]
    assert "**✗ vllm:** vLLM exited with code" in status and "No module named" in status, status
    assert list(final["run_state"].traces()) == ["static", "continuous"]
    assert "✓ all match" in status, status


def _with_source(loaded, folder: Path, head_dim: int = 32):
    """The tiny model as if loaded from ``folder`` (what vLLM would be asked to load), its
    config saying heads of ``head_dim`` (vLLM's CPU attention takes 32, not the tiny 16)."""
    loaded = copy.copy(loaded)
    loaded.source = str(folder)
    loaded.model = copy.copy(loaded.model)  # its own config; the weights are shared
    loaded.model.config = copy.deepcopy(loaded.model.config)
    loaded.model.config.head_dim = head_dim
    return loaded


def test_a_model_vllm_cannot_serve_is_failed_on_the_page_with_why(page, tmp_path, monkeypatch):
    """--vllm on a model whose heads vLLM's CPU attention lacks (16): the page starts anyway and
    the servers line lists vLLM as failed with the head sizes it takes. A missing build is said
    first: it is what to fix first."""
    if not Path(os.environ.get("CBP_VLLM_VENV", ".venv-vllm"), "bin", "python").exists():
        monkeypatch.setenv("CBP_VLLM_VENV", str(Path(sys.executable).parent.parent))
    loaded, logged = _with_source(page.worker.model.loaded, tmp_path, head_dim=16), []
    page.servers = server_choice.build(loaded, ServerChoice(vllm=True), logged.append).start()
    assert page.servers.status("vllm").state == server_set.FAILED
    line = server_view.servers_markdown(page.servers)
    assert "**vllm**: ✗ vLLM's CPU attention takes heads of 32, 64" in line, line
    assert "this model's have 16" in line and str(tmp_path) not in line, line
    monkeypatch.setenv("CBP_VLLM_VENV", str(tmp_path / "missing"))
    missing = server_choice.build(loaded, ServerChoice(vllm=True)).start()
    assert "no vLLM here" in server_view.servers_markdown(missing)


def _wait_started(host: server_set.ServerSet, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while host.starting():
        assert time.monotonic() < deadline, "the servers did not settle in time"
        time.sleep(0.1)


@needs_vllm
def test_the_local_vllm_computes_on_the_engines_cpus_with_as_many_threads(page, tmp_path):
    """Given the engines' CPUs (1 of them), the local vLLM binds its threads to them: one thread
    on CPU 1, as our engines run. Without them, every CPU."""
    loaded = _with_source(page.worker.model.loaded, tmp_path)
    split = server_choice.build(loaded, ServerChoice(vllm=True), cpus=(1,))
    settings = split.engines["vllm"].server.settings
    assert settings.omp_threads_bind == "1" and split.engines["vllm"].server.cpus() == {1}
    every = server_choice.build(loaded, ServerChoice(vllm=True)).engines["vllm"].server.settings
    assert every.omp_threads_bind == f"0-{(os.cpu_count() or 1) - 1}", every.omp_threads_bind
