"""The bench's ``--endpoint-record``: an endpoint seen from the inside through its served record,
our engine on the deployment's settings, and record addresses that give no record.

The contract test starts vLLM as a user would, in a process of its own (not the bench's ``vllm``
engine); the error cases run against a real ``transformers serve`` endpoint beside record servers
of the recording scheduler's own module (``RecordHelper``)."""

from __future__ import annotations

import json

import pytest

from engine.bench import cli as bench
from tests.bench.workload_files import write_workload
from tests.captured_vllm import captured_records
from tests.live_servers import RecordHelper, UserVllm, free_port, needs_vllm

ROWS = [("The capital of France is", 8), ("1, 2, 3,", 6)]  # each fits 5 blocks of 32 tokens


@pytest.fixture(scope="module")
def user_vllm(embedded_model):
    """One vLLM for this module's tests, started as a user would; stopped after them."""
    server = UserVllm(embedded_model.source).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rings():
    """Record servers of the recording scheduler's module, without vLLM; stopped after."""
    helper = RecordHelper()
    yield helper
    helper.stop()


def _bench(argv: list[str], tmp_path, capsys) -> tuple[int, dict, str]:
    """The bench's exit code, its JSON's engines, and its stderr then its stdout."""
    out = tmp_path / "out.json"
    code = bench.main([*argv, "--json", str(out)])
    said = capsys.readouterr()
    engines = json.loads(out.read_text())["engines"] if out.exists() else {}
    return code, engines, said.err + said.out


@needs_vllm
@pytest.mark.real_model
def test_a_user_started_vllm_is_seen_from_the_inside(
    user_vllm, embedded_model, tmp_path, monkeypatch, capsys
):
    """The contract: beside a vLLM the user started with a served record, the endpoint's entry
    counts its steps from that record, plans as ours on at least 95 % of steps, matches the
    float32 reference, and ours ran on the deployment's settings, which the bench names."""
    monkeypatch.setattr("engine.model.loader.load_model", lambda *a, **k: embedded_model)
    monkeypatch.delenv("CBP_VLLM_RECORD_TOKEN", raising=False)
    argv = ["--workload", "seed", "--slots", "3", "--engines", "continuous_paged"]
    argv += ["--endpoint", f"myvllm={user_vllm.url}"]
    argv += ["--endpoint-record", f"myvllm={user_vllm.record_url}"]
    code, engines, err = _bench(argv, tmp_path, capsys)
    assert code == 0, err[-4000:]
    assert str(embedded_model.dtype) == "torch.float32", embedded_model.dtype
    entry = engines["myvllm"]
    schedule = entry["server"]["schedule"]
    assert entry["num_steps"] == schedule["num_steps"] > 0, schedule
    comparison = entry["schedule_comparison"]
    assert comparison["equal_step_fraction"] >= 0.95, comparison["first_difference"]
    assert entry["reference_match"] is True, entry.get("num_mismatched_requests")
    taken = comparison["settings_taken"]
    assert (taken["from"], taken["max_num_seqs"], taken["dtype"]) == ("myvllm", 3, "float32"), taken
    assert "myvllm's settings, from its record's start line: max_num_seqs 3" in err, err[-3000:]
    assert entry["info"]["schedule_record"]["url"] == f"{user_vllm.record_url}/record"


def _not_answering(serve, rings) -> str:
    return f"http://127.0.0.1:{free_port()}"


def _another_server(serve, rings) -> str:
    return serve.url  # the endpoint's own API: it answers, without a record


def _with_token(serve, rings) -> str:
    url = rings.serve(":0", token="s3cret")
    rings.feed(url, captured_records()[1][:1])
    return url


def _another_run(serve, rings) -> str:
    url = rings.serve(":0")
    rings.feed(url, captured_records()[1])  # a real vLLM's record of a run that is not this one
    return url


@needs_vllm
@pytest.mark.real_model
@pytest.mark.parametrize(
    ("record", "words", "follows"),
    [
        (_not_answering, "does not answer", False),
        (_another_server, "answers (HTTP 404) but without a record", False),
        (_with_token, "needs a token: set CBP_VLLM_RECORD_TOKEN", False),
        (_another_run, "holds no step while this run ran", True),
    ],
)
def test_a_record_address_without_this_runs_record_says_which(
    record, words, follows, serve, rings, embedded_model, tmp_path, monkeypatch, capsys
):
    """A record address that does not answer, answers without a record, needs a token, or holds
    another run's steps: the bench says which in one warning line and still reports the
    endpoint's outside view (its outputs, checked, and its times); ours takes the settings of
    a record whose start line it could read."""
    monkeypatch.setattr("engine.model.loader.load_model", lambda *a, **k: embedded_model)
    monkeypatch.delenv("CBP_VLLM_RECORD_TOKEN", raising=False)
    argv = ["--workload", write_workload(tmp_path, ROWS), "--engines", "continuous_paged"]
    argv += ["--endpoint", f"hf={serve.url}", "--endpoint-record", f"hf={record(serve, rings)}"]
    code, engines, err = _bench(argv, tmp_path, capsys)
    assert code == 0, err[-4000:]
    lines = [line for line in err.splitlines() if line.startswith("warning: hf: no inside view:")]
    assert len(lines) == 1 and words in lines[0], err[-3000:]
    entry = engines["hf"]
    num_ours = engines["continuous_paged"]["num_generated_tokens"]
    assert entry["reference_match"] is True and entry["num_generated_tokens"] == num_ours > 0
    assert entry["latency_percentiles"] and entry["num_steps"] == 0, entry
    assert "schedule_comparison" not in entry, entry["schedule_comparison"]
    assert words in entry["info"]["schedule_record"]["error"], entry["info"]["schedule_record"]
    took = "continuous_paged: hf's settings, from its record's start line: max_num_seqs 3" in err
    assert took == follows, f"settings taken: {took}, expected {follows}:\n{err[-3000:]}"
