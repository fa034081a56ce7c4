"""The local vLLM's settings are fixed when the page starts: a run whose engines differ from it in
prefix caching gets a warning line, like one in other slots or another precision, when that
changes the comparison: prompts that share KV blocks, or prefix hits in vLLM's record."""

from __future__ import annotations

from types import SimpleNamespace

from engine.host_servers import server_runs, server_set
from engine.peers.endpoints import Endpoint
from engine.peers.openai_engine import OpenAIEngine
from engine.peers.vllm_server import VllmSettings
from engine.trace import PREFILL, ScheduledSeq, StepRecord, Trace
from engine.workloads.workload import SEED_REQUESTS
from tests.tiny_model import make_requests

SYSTEM = "You are the shop's helpful assistant; answer in one sentence. "  # 62 bytes: 3 blocks
SHARED = make_requests([(SYSTEM + "Where is my parcel?", 4), (SYSTEM + "Can I return it?", 4)])
UNSHARED = make_requests(list(SEED_REQUESTS))  # the article's six: no 16 tokens in common


def _trace(hits: int = 0, block_size: int | None = 16) -> Trace:
    """vLLM's trace as the client holds it (no steps), with its own record in ``schedule``: a
    run whose one admission found ``hits`` tokens in its prefix cache, in blocks of
    ``block_size`` tokens (None: a record without it); ``block_size=0``: no record at all."""
    trace = Trace(engine="vllm", num_slots=3)
    if block_size == 0:
        return trace
    seqs = [ScheduledSeq(0, 0, PREFILL, 20, 0, 0, hits)]
    trace.schedule = Trace(engine="vllm", num_slots=3, steps=[StepRecord(0, 0.0, 1.0, seqs)])
    trace.schedule.info["block_size"] = block_size
    return trace


def _warnings(prefix_caching: bool | None, name="vllm", ours=False, requests=SHARED, trace=None):
    trace = trace or _trace()
    return server_runs._prefix_warnings(_servers(prefix_caching), name, ours, requests, trace)


def _servers(prefix_caching: bool | None) -> server_set.ServerSet:
    """A page's servers with a local vLLM (not started) whose prefix caching is as given."""
    settings = VllmSettings("model", "float32", 3, prefix_caching=prefix_caching)
    tokens = SimpleNamespace(eos_token_ids=())  # the model, as far as a server engine's init reads
    local = OpenAIEngine(Endpoint("vllm", "http://127.0.0.1:1"), tokens, 3)
    local.server = SimpleNamespace(settings=settings)  # never started: its settings are read
    remote = OpenAIEngine(Endpoint("remote", "http://127.0.0.1:2"), tokens, 3)
    return server_set.ServerSet({"vllm": local, "remote": remote})


def test_a_run_without_prefix_caching_beside_vllms_default_is_warned():
    """vLLM caches prefixes by default; our engines without it: one line naming both."""
    (line,) = _warnings(None)
    assert "vllm caches prompt prefixes" in line and "engines did not" in line, line
    assert "prompts share 3 blocks of 16 tokens" in line, line


def test_the_other_way_round_is_warned_too():
    (line,) = _warnings(False, ours=True)
    assert "vllm does not cache prompt prefixes" in line and "engines did (" in line, line


def test_alike_settings_an_endpoint_and_an_unknown_setting_are_not_warned():
    assert _warnings(None, ours=True) == []
    assert _warnings(False, ours=False) == []
    assert _warnings(None, name="remote") == []
    assert _warnings(None, ours=None) == []


def test_prompts_that_share_no_block_are_not_warned():
    """The article's six prompts share no 16-token block and vLLM's record has no hit: the
    difference in prefix caching changes nothing, so no line (issue 51, item 6)."""
    assert _warnings(None, requests=UNSHARED) == [], "warned on prompts that share no prefix"
    assert _warnings(None, requests=UNSHARED, trace=_trace(block_size=None)) == []


def test_a_prefix_hit_in_vllms_record_is_warned_even_without_shared_prompts():
    """vLLM's cache outlives a run: a hit from an earlier run's prompts changes this one."""
    (line,) = _warnings(None, requests=UNSHARED, trace=_trace(hits=16))
    assert "1 of its admissions started from cached blocks" in line, line


def test_a_block_counts_only_where_a_prompt_goes_on_past_it():
    """Two identical 16-token prompts share no servable block (the last token is computed);
    17 tokens share one."""
    same16 = make_requests([("a" * 16, 2), ("a" * 16, 2)])
    same17 = make_requests([("a" * 17, 2), ("a" * 17, 2)])
    assert _warnings(None, requests=same16) == []
    (line,) = _warnings(None, requests=same17)
    assert "share 1 block of 16 tokens" in line, line


def test_the_block_size_and_hits_are_read_from_vllms_own_record():
    """The client's trace has no steps: the hits and the block size come from vLLM's record
    (``trace.schedule``). Blocks of 128 tokens (vLLM's on CPUs): the shop prompts' 62 shared
    bytes fill none, so no line; a hit in the record is a line even so."""
    assert _warnings(None, trace=_trace(block_size=128)) == [], "counted in blocks of 16"
    (line,) = _warnings(None, trace=_trace(hits=128, block_size=128))
    assert "1 of its admissions started from cached blocks" in line, line


def test_without_a_record_the_smallest_block_size_is_assumed():
    """No record (its read failed): blocks of 16 tokens, vLLM's smallest default, so shared
    prompts are warned rather than missed."""
    (line,) = _warnings(None, trace=_trace(block_size=0))
    assert "prompts share 3 blocks of 16 tokens" in line, line
