"""The recording scheduler's record over HTTP, without starting vLLM: its ring and server run in a
helper process of vLLM's environment (the scheduler's module imports vllm, which ours lacks), are
fed record lines, and are read back here with ``RecordFeed`` as the file reader reads the file."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from engine import trace_codec
from engine.peers.vllm_record import RecordError, RecordFeed, ScheduleLog, schedule_trace
from tests.captured_vllm import CAPTURED, captured_records, client_requests
from tests.live_servers import RecordHelper as Helper
from tests.live_servers import free_port, needs_vllm
from tests.live_servers import record_line as _line

pytestmark = needs_vllm
START = {"event": "start", "format": 1, "max_num_seqs": 3, "block_size": 32}
ADDRESS, TOKEN, STEPS = "CBP_VLLM_RECORD_ADDRESS", "CBP_VLLM_RECORD_TOKEN", "CBP_VLLM_RECORD_STEPS"


@pytest.fixture(scope="module")
def helper():
    process = Helper()
    yield process
    process.stop()


def _step(i: int) -> str:
    return _line({"event": "step", "step": i, "num_tokens": 1, "scheduled": []})


@pytest.fixture
def served(helper):
    """A record server on 127.0.0.1 and a free port, holding 4 steps at most; closed after."""
    url = helper.serve(max_num_steps=4)
    helper.feed(url, [START])
    yield url
    helper.close(url)


def test_steps_since_an_index_with_the_oldest_and_the_next(helper, served):
    """Of 10 steps, a ring of 4 holds 6 to 9: ``since`` picks from there, ``oldest`` and ``next``
    say what it holds, and ``mark`` gives the next index."""
    feed = RecordFeed(served)
    assert feed.mark() == 0 and feed.read(0) == [START], "an empty ring gave steps"
    helper.feed(served, [_step(i) for i in range(10)])
    page = feed.fetch(0)
    assert (page["oldest"], page["next"], page["max_num_steps"]) == (6, 10, 4), page
    assert [s["step"] for s in page["steps"]] == [6, 7, 8, 9], "the ring is not the latest 4"
    records = feed.read(7)
    assert records[0] == START and [r["step"] for r in records[1:]] == [7, 8, 9], records
    assert feed.mark() == 10 and feed.read(10) == [START], "past the last step: the start alone"
    assert feed.start == START, "the feed does not remember the start line"


def test_steps_dropped_from_the_ring_are_an_error_that_says_which(helper, served):
    """Asking for steps the ring no longer holds names them and the setting to raise."""
    helper.feed(served, [_step(i) for i in range(10)])
    with pytest.raises(RecordError, match=rf"steps 3 to 5 .*{STEPS}"):
        RecordFeed(served).read(3)


def test_the_served_record_is_the_file_record(helper):
    """The captured vLLM record, served line by line, reads back as the same records list as the
    file, and replays into the same trace."""
    capture, records = captured_records()
    url = helper.serve(":0", max_num_steps=len(records))
    try:
        helper.feed(url, records)
        over_http = RecordFeed(url.removeprefix("http://")).read(0)
    finally:
        helper.close(url)
    from_file = ScheduleLog(CAPTURED).read(0)[1:]  # after the capture line
    assert over_http == from_file == records, "the served record differs from the file's"
    args = (client_requests(capture), capture["run_tag"], capture["t0_unix_s"])
    http_trace, file_trace = schedule_trace(over_http, *args), schedule_trace(from_file, *args)
    assert trace_codec.encode(http_trace) == trace_codec.encode(file_trace), "the traces differ"


def test_a_token_guards_the_record(helper):
    """With a token, a request without it or with another gets 401, and the feed says what to
    set; with it, the record."""
    url = helper.serve(":0", token="s3cret")
    try:
        helper.feed(url, [START])
        bare = httpx.get(f"{url}/record")
        assert bare.status_code == 401 and bare.headers["WWW-Authenticate"] == "Bearer", bare
        with pytest.raises(RecordError, match=f"needs a token.*{TOKEN}"):
            RecordFeed(url, token="").fetch(0)
        with pytest.raises(RecordError, match="refuses the token"):
            RecordFeed(url, token="guess").fetch(0)
        assert RecordFeed(url, token="s3cret").read(0) == [START], "the right token was refused"
    finally:
        helper.close(url)


def test_an_address_that_does_not_answer():
    """Nothing listening: the feed says the address does not answer and what to check."""
    with pytest.raises(RecordError, match=f"does not answer.*{ADDRESS}"):
        RecordFeed(f"127.0.0.1:{free_port()}", timeout_s=2.0).mark()


class _NotARecord(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_an_address_that_answers_without_a_record(served):
    """Another server (JSON, but not a record), or the record server at another path: the feed
    says it answers without a record."""
    other = ThreadingHTTPServer(("127.0.0.1", 0), _NotARecord)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RecordError, match=r"HTTP 200\) but without a record"):
            RecordFeed(f"http://127.0.0.1:{other.server_address[1]}/v1/models").mark()
    finally:
        other.shutdown()
        other.server_close()
    with pytest.raises(RecordError, match=r"HTTP 404\) but without a record"):
        RecordFeed(f"{served}/metrics").mark()
    assert httpx.get(f"{served}/record?since=x").status_code == 400, "a bad since was taken"


def test_addresses_and_the_environment(helper):
    """Unset serves nothing; ``:PORT`` binds 127.0.0.1 with the default ring; the ring's size
    comes from its variable; a bad address, size, or a taken port is refused, naming it."""
    assert helper.ask(op="env", env={}, unset=[ADDRESS, STEPS, TOKEN]) is None, "served unset"
    first = helper.ask(op="env", env={ADDRESS: ":0"})
    assert (first["host"], first["max_num_steps"]) == ("127.0.0.1", 4096), first
    taken = helper.ask(op="env", env={ADDRESS: f"127.0.0.1:{first['port']}"})
    assert "cannot serve the record there" in taken["error"], taken
    assert ADDRESS in helper.ask(op="env", env={ADDRESS: "localhost"})["error"]
    for bad in ("many", "0"):
        assert STEPS in helper.ask(op="env", env={ADDRESS: ":0", STEPS: bad})["error"], bad
    sized = helper.ask(op="env", env={ADDRESS: "0.0.0.0:0", STEPS: "3"})
    assert (sized["host"], sized["max_num_steps"]) == ("0.0.0.0", 3), sized
    for answer in (first, sized):
        helper.ask(op="close", port=answer["port"])


def test_a_data_parallel_rank_serves_its_record_on_the_port_plus_its_rank(helper):
    """Rank r of a data-parallel vLLM serves on the address's port plus r (port 0: any); the
    scheduler reads its rank and the number of ranks from vLLM's parallel config."""
    port = free_port()
    served = helper.ask(op="env", env={ADDRESS: f"127.0.0.1:{port - 1}"}, port_offset=1)
    assert served["port"] == port, served
    helper.ask(op="close", port=served["port"])
    anywhere = helper.ask(op="env", env={ADDRESS: ":0"}, port_offset=3)
    assert anywhere["port"] != 3, anywhere
    helper.ask(op="close", port=anywhere["port"])
    parallel = {"data_parallel_rank": 1, "data_parallel_size": 2}
    assert helper.ask(op="dp", parallel=parallel) == {"rank": 1, "size": 2}
    assert helper.ask(op="dp", parallel={}) == {"rank": 0, "size": 1}


@pytest.mark.real_model
def test_a_real_vllm_serves_the_record_its_file_holds(embedded_model, monkeypatch):
    """A vLLM started with a record address and a record file: after a small run, the record
    read over HTTP from the run's mark is the file's, line for line, with no prompt text."""
    from engine.peers.vllm_server import VllmServer, settings_for

    port = free_port()
    monkeypatch.setenv(ADDRESS, f"127.0.0.1:{port}")
    monkeypatch.delenv(TOKEN, raising=False)
    settings = settings_for(embedded_model, 2, enforce_eager=True, max_model_len=256)
    with VllmServer(settings) as server:
        feed, log = RecordFeed(f"127.0.0.1:{port}"), ScheduleLog(server.schedule_path)
        http_mark, file_mark = feed.mark(), log.mark()
        body = {"model": settings.model_dir, "prompt": "The cat sat on", "max_tokens": 4}
        for _ in range(2):
            answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
        time.sleep(1.0)  # the last step's line is written when its output is back
        over_http, from_file = feed.read(http_mark), log.read(file_mark)
    steps = [r for r in over_http if r["event"] == "step"]
    assert len(steps) >= 8, f"a run of 2 x 4 tokens gave {len(steps)} steps"
    assert over_http == from_file, "the record over HTTP differs from the file's"
    start = over_http[0]
    assert (start["dp_rank"], start["dp_size"]) == (0, 1), "the start line names no rank"
    assert all(s["dp_rank"] == 0 for s in steps), "a step without its rank"
    assert "cat sat" not in json.dumps(over_http), "the record holds a prompt's text"
