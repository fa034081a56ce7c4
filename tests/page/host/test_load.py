"""Many users at once: concurrent Runs through ``gradio_client`` each get their own checked result.

One ``app.py`` server, with its engines in an engine process (``CBP_ENGINE_PROCESS=on``), is hit
by 8 client threads at the same moment, each with its own tiny workload (1-2 requests, caps 2-4).
The Run event is queued with ``concurrency_limit=1``, so the runs are serialised; ``/run`` streams
progress and ``predict`` returns its last (final) output. The test checks that no user sees
another user's prompts or an unchecked result, and that the server still answers afterwards.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pytest
from server_kit import SERVERS, start_app_server

try:
    from gradio_client import Client
except ImportError:  # gradio_client ships with gradio, but keep the module importable without it
    Client = None

NUM_CLIENTS = 8
LOAD_TIMEOUT_S = 600  # all 8 runs, serialised on 2 CPU cores; each takes a few seconds
OUTPUTS_INDEX, STATUS_INDEX = 6, 7  # in /run's returned tuple (run_state is not returned)
MATCH_TEXT = "✓ all match"
# Knobs after the table and slots: chat_template, check_reference, kv_mode, token_budget, policy,
# compare_hf, arrival_rate, x_axis.
DEFAULT_KNOBS = (False, True, "slots", 0, "decode_first", False, 0, "time")
WORKLOADS = [  # (rows, slots): each user's prompts differ from every other user's
    ([["The capital of France is", 3]], 1),
    ([["Cats like to", 2], ["Dogs enjoy", 4]], 2),
    ([["The sky is", 4]], 2),
    ([["Water boils at", 2], ["Ice melts when", 3]], 1),
    ([["My favourite colour is", 3], ["Music makes people", 2]], 2),
    ([["The ocean is full of", 2]], 1),
    ([["Mountains are", 4], ["Rivers flow into", 4]], 2),
    ([["A good breakfast has", 3], ["Trains run on", 2]], 1),
]

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(Client is None, reason="the gradio_client package is not installed"),
]


@pytest.fixture(scope="module")
def server_url(request, tmp_path_factory) -> str:
    """``app.py`` with ``CBP_ENGINE_PROCESS=on`` (the default, auto, is on here too), for every
    test here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CBP_ENGINE_PROCESS", "on")
        return start_app_server(request, tmp_path_factory)


def _run(url: str, rows: list[list], num_slots: int) -> tuple[str, list[str]]:
    """One user's Run through the API: the status text and the outputs table's prompts."""
    client = Client(url, verbose=False)
    table = {"headers": ["prompt", "max_new_tokens"], "data": rows}
    result = client.predict(table, num_slots, *DEFAULT_KNOBS, api_name="/run")
    outputs = _value(result[OUTPUTS_INDEX])  # returned as a gr.update(...) dict, value inside
    prompt_col = outputs["headers"].index("prompt")
    return result[STATUS_INDEX], [row[prompt_col] for row in outputs["data"]]


def test_concurrent_users_each_get_their_own_checked_result(server_url: str) -> None:
    """8 simultaneous Runs each return their own prompts, checked, and the app keeps serving."""
    assert len({rows[0][0] for rows, _ in WORKLOADS}) == NUM_CLIENTS, "workloads must differ"
    pool = ThreadPoolExecutor(max_workers=NUM_CLIENTS)
    try:
        futures = {
            pool.submit(_run, server_url, rows, slots): i
            for i, (rows, slots) in enumerate(WORKLOADS)
        }
        done = as_completed(futures, timeout=LOAD_TIMEOUT_S)  # TimeoutError fails the test
        results = {futures[future]: future.result() for future in done}
    finally:  # never wait on a hung client; stopping the server ends its request
        pool.shutdown(wait=False, cancel_futures=True)
    for i, (rows, _) in enumerate(WORKLOADS):
        status, prompts = results[i]
        assert MATCH_TEXT in status, f"client {i}: outputs not checked or mismatched: {status!r}"
        expected = [prompt for prompt, _ in rows]
        assert prompts == expected, f"client {i} got prompts {prompts}, sent {expected}"

    status, prompts = _run(server_url, [["After the rush, the server", 2]], 1)
    assert MATCH_TEXT in status, f"the Run after the load failed: {status!r}"
    assert prompts == ["After the rush, the server"], f"the Run after the load got {prompts}"


def test_a_run_streams_its_progress_through_the_server(server_url: str) -> None:
    """A run long enough to stream sends live status lines before its checked final result."""
    client = Client(server_url, verbose=False)
    rows = [["Write a sentence about the sea:", 24], ["Name three colours:", 12]]
    table = {"headers": ["prompt", "max_new_tokens"], "data": rows}
    job = client.submit(table, 2, *DEFAULT_KNOBS, api_name="/run")
    job.result(timeout=LOAD_TIMEOUT_S)
    statuses = [_value(update[STATUS_INDEX]) for update in job.outputs()]
    assert any(str(s).startswith("**Running**") for s in statuses[:-1]), statuses
    assert MATCH_TEXT in statuses[-1], statuses[-1]


def _cpu_s(pid: int) -> float:
    """A process's user and system CPU time so far, seconds (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _engine_processes(pid: int) -> list[int]:
    """The children of ``pid`` that multiprocessing spawned (the engine process)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError):  # a process that ended meanwhile
            continue
        if parent == pid and b"spawn_main" in command:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_launched_apps_engines_run_in_the_engine_process(server_url: str) -> None:
    """app.py (CBP_ENGINE_PROCESS=on) has one engine process, and a run's CPU time is spent
    there rather than in the page's process."""
    page_pid = SERVERS[server_url].pid
    workers = _engine_processes(page_pid)
    assert len(workers) == 1, f"app.py should have one engine process, has {workers}"
    before = _cpu_s(page_pid), _cpu_s(workers[0])
    status, _ = _run(
        server_url, [["Write a sentence about the sea:", 32], ["Name a colour:", 16]], 2
    )
    page_s, worker_s = _cpu_s(page_pid) - before[0], _cpu_s(workers[0]) - before[1]
    assert MATCH_TEXT in status, status
    assert worker_s > page_s, f"the engine process used {worker_s:.2f} s, the page {page_s:.2f} s"


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and two CPUs",
)
def test_a_launched_apps_engines_keep_cpus_of_their_own(server_url: str) -> None:
    """With CBP_ENGINE_CPUS unset (auto), the engine process and the page's threads run on
    CPUs that do not overlap and together make every CPU the server was started with."""
    page_pid = SERVERS[server_url].pid
    (worker,) = _engine_processes(page_pid)
    page_cpus = _thread_cpus(page_pid)
    worker_cpus = _thread_cpus(worker)
    assert len(page_cpus) == 1, f"the page's threads run on different CPUs: {page_cpus}"
    assert len(worker_cpus) == 1, f"the engine process's threads differ: {worker_cpus}"
    page, engines = page_cpus.pop(), worker_cpus.pop()
    assert not page & engines, f"page {page}, engines {engines}"
    assert page | engines == frozenset(os.sched_getaffinity(0))
    assert min(page) == min(os.sched_getaffinity(0)), "auto leaves the page the first CPU"


PAGE_RSS_BOUND_BYTES = 2**30  # the page's process with a tokenizer: about half of this


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc (Linux)")
def test_the_page_process_holds_no_weights_beside_its_engine_process(server_url: str) -> None:
    """The launched page's process maps no weights file (a process that loads the model maps its
    safetensors) and stays under 1 GiB resident after the runs above: the model is the engine
    process's alone."""
    page_pid = SERVERS[server_url].pid
    assert len(_engine_processes(page_pid)) == 1, "app.py should have one engine process"
    maps = Path(f"/proc/{page_pid}/maps").read_text().splitlines()
    weights = sorted({line.split()[-1] for line in maps if line.endswith(".safetensors")})
    assert not weights, f"the page's process maps the model's weights: {weights}"
    rss_bytes = int(Path(f"/proc/{page_pid}/statm").read_text().split()[1]) * os.sysconf(
        "SC_PAGE_SIZE"
    )
    assert rss_bytes < PAGE_RSS_BOUND_BYTES, f"the page's process holds {rss_bytes / 2**20:.0f} MiB"


def _thread_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets ``pid``'s threads may run on (one set if every thread has the same)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.add(frozenset(os.sched_getaffinity(int(task.name))))
        except OSError:  # a thread that ended meanwhile
            continue
    return found


def _value(output):
    """An output as the client hands it: a plain value, or an update dict holding one."""
    return output.get("value", output) if isinstance(output, dict) else output
