"""Batch-invariant mode on the tiny model: packed logits equal solo logits bitwise, in float32 and
bfloat16, for every KV mode, with chunked prefill and after preemption; and the mode is correct."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tiny_model import VOCAB, make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.divergence import MATCH
from engine.fidelity.reference import ReferenceCache, SoloReference
from engine.kernels import invariant_ops
from engine.kernels.invariant_attention import sequence_attention
from engine.model.model_runner import ModelRunner
from engine.sequence import Request

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _runner(dtype: torch.dtype) -> ModelRunner:
    runner = tiny_runner(seed=5)
    runner.model.to(dtype)
    runner.dtype = runner.loaded.dtype = dtype
    return runner


@pytest.fixture(scope="module", params=list(DTYPES))
def setup(request):
    """(runner, solo reference) per dtype; the reference's cache is shared by the tests."""
    runner = _runner(DTYPES[request.param])
    return runner, SoloReference(runner)


def _assert_bitwise(solo, requests, trace):
    for rid, verdict in solo.verdicts(requests, trace).items():
        assert verdict.verdict == MATCH, f"R{rid}: {verdict.label} ({verdict.reason})"
        assert verdict.logits_equal, f"R{rid}: same tokens, but the logits are not bitwise equal"


prompts = st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=40).map(tuple)
workloads = st.lists(st.tuples(prompts, st.integers(1, 10)), min_size=1, max_size=6)


@settings(max_examples=12, deadline=None)
@given(
    workload=workloads,
    num_slots=st.integers(1, 4),
    kv_mode=st.sampled_from(["slots", "paged", "concat"]),
    budget_extra=st.one_of(st.none(), st.integers(0, 6), st.integers(7, 30)),
)
@example(  # a prompt chunked 6, 6, 6, 1: a one-row chunk once took another GEMM path
    workload=[(tuple(range(3, 22)), 8), (tuple(range(30, 42)), 6)],
    num_slots=2,
    kv_mode="slots",
    budget_extra=4,
)
def test_packed_logits_equal_solo_logits_bitwise(setup, workload, num_slots, kv_mode, budget_extra):
    """Any batch composition, KV mode and token budget (chunked prefill): logits as run alone."""
    runner, solo = setup
    requests = [Request(i, "p", cap, ids) for i, (ids, cap) in enumerate(workload)]
    budget = None if budget_extra is None else num_slots + budget_extra
    config = EngineConfig(
        num_slots, kv_mode=kv_mode, max_num_batched_tokens=budget, batch_invariant=True
    )
    _assert_bitwise(solo, requests, ContinuousEngine(runner, config).run(requests))


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(list(DTYPES.values())),
    num_rows=st.integers(1, 150),
    cuts=st.lists(st.integers(1, 149), max_size=4),
)
def test_a_query_row_attends_the_same_in_any_chunking(dtype, num_rows, cuts):
    """sequence_attention: each row's output is bitwise the same whatever chunks the rows form."""
    torch.manual_seed(num_rows)
    q = torch.randn(4, num_rows, 16).to(dtype)
    keys, values = torch.randn(2, num_rows, 16).to(dtype), torch.randn(2, num_rows, 16).to(dtype)
    whole = sequence_attention(q, keys, values, 0, 0.25)
    bounds = sorted({0, num_rows, *(c for c in cuts if c < num_rows)})
    for a, b in zip(bounds, bounds[1:], strict=False):
        part = sequence_attention(q[:, a:b], keys[:, :b], values[:, :b], a, 0.25)
        assert torch.equal(part, whole[a:b]), f"rows {a}..{b - 1} changed with their chunk"


def test_logits_stay_bitwise_after_preemption(setup):
    """A paged pool too small for three sequences preempts and recomputes; logits still equal."""
    runner, solo = setup
    requests = make_requests([("the quick brown fox", 20), ("hello world!", 20), ("abcdefg", 20)])
    block_bytes = runner.kv_bytes_per_token() * 4
    config = EngineConfig(
        3, kv_mode="paged", block_size=4, kv_budget_mib=14 * block_bytes / 2**20,
        max_num_batched_tokens=6, batch_invariant=True,
    )  # fmt: skip
    trace = ContinuousEngine(runner, config).run(requests)
    assert sum(r.num_preemptions for r in trace.requests) > 0, "the pool did not run dry"
    _assert_bitwise(solo, requests, trace)


@pytest.mark.parametrize("num_slots", [2, 3])
def test_static_waves_equal_solo_logits_bitwise(setup, num_slots):
    """Padded generate waves in batch-invariant mode: each row's logits as the solo run's."""
    runner, solo = setup
    requests = make_requests([("hi", 9), ("a longer prompt here", 5), ("xyz", 12), ("q", 3)])
    trace = StaticEngine(runner, EngineConfig(num_slots, batch_invariant=True)).run(requests)
    _assert_bitwise(solo, requests, trace)


def test_invariant_mode_still_matches_generate_token_for_token():
    """In float32 the mode's greedy outputs equal per-request model.generate (it is correct)."""
    runner = _runner(torch.float32)
    requests = make_requests([("hello world", 5), ("a", 20), ("the quick brown fox", 30)])
    reference = ReferenceCache(runner).outputs(requests)
    for engine in (
        ContinuousEngine(runner, EngineConfig(2, kv_mode="paged", batch_invariant=True)),
        StaticEngine(runner, EngineConfig(2, batch_invariant=True)),
    ):
        outputs = {r.request_id: r.output_token_ids for r in engine.run(requests).requests}
        assert outputs == reference, f"{engine.name}: differs from model.generate"


def test_sequence_attention_is_causal_attention():
    """The blockwise per-row attention equals SDPA's causal attention to float32 rounding."""
    torch.manual_seed(0)
    heads, kv_heads, n, first, dim = 4, 2, 70, 60, 16  # 130 keys: three key blocks
    q = torch.randn(heads, n, dim)
    keys, values = torch.randn(kv_heads, first + n, dim), torch.randn(kv_heads, first + n, dim)
    got = sequence_attention(q, keys, values, first, dim**-0.5)  # (n, H, D)
    mask = torch.arange(first + n)[None, :] <= torch.arange(first, first + n)[:, None]
    want = F.scaled_dot_product_attention(
        q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True
    )[0]  # (H, n, D)
    torch.testing.assert_close(got, want.transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_a_row_through_tiled_rows_ignores_its_neighbours():
    """tiled_rows: a row's result does not depend on the rows around it or on the row count."""
    torch.manual_seed(1)
    weight = torch.randn(48, 64)
    row = torch.randn(64)
    results = []
    for count, at in ((1, 0), (5, 3), (13, 9), (16, 15)):
        x = torch.randn(count, 64)
        x[at] = row
        results.append(invariant_ops.tiled_rows(lambda t: F.linear(t, weight), x)[at])
    assert all(torch.equal(r, results[0]) for r in results), "a row's output moved"


def test_rope_table_gives_the_module_own_cos_and_sin():
    """The rotary table's values are the rotary module's own, at any positions."""
    runner = _runner(torch.float32)
    rotary = runner.model.model.rotary_emb
    positions = torch.tensor([[0, 5, 63, 64, 130]])
    probe = torch.empty(0)
    want_cos, want_sin = rotary(probe, positions)
    got_cos, got_sin = invariant_ops.RopeTable(rotary).forward(probe, positions)
    torch.testing.assert_close(got_cos, want_cos, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_sin, want_sin, rtol=1e-6, atol=1e-6)


def test_a_model_the_mode_does_not_cover_is_refused_early():
    """A GPT-2 (LayerNorm, no rotary) is refused at engine construction, naming the module."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB)).eval()
    loaded = SimpleNamespace(**{**vars(tiny_runner().loaded), "model": model})
    with pytest.raises(ValueError, match="supports Llama-style models; GPT2LMHeadModel has no"):
        ContinuousEngine(ModelRunner(loaded), EngineConfig(2, batch_invariant=True))


def test_transformers_engine_says_it_cannot_be_batch_invariant():
    """hf_continuous with batch_invariant warns and its trace says so, rather than ignore it."""
    from engine.peers.transformers_engine import HFContinuousEngine

    runner = _runner(torch.float32)
    with pytest.warns(UserWarning, match="does not apply to transformers' continuous batching"):
        engine = HFContinuousEngine(runner, EngineConfig(2, batch_invariant=True))
    trace = engine.run(make_requests([("hello", 3)]))
    assert (
        trace.info["batch_invariant"] is False and "outside" in trace.info["batch_invariant_note"]
    )


def test_batch_invariant_must_be_a_bool():
    """EngineConfig refuses a batch_invariant that is not True or False."""
    with pytest.raises(ValueError, match="batch_invariant must be True or False"):
        EngineConfig(2, batch_invariant="yes")


def test_the_model_is_itself_again_after_an_invariant_run():
    """After a run in the mode, no module keeps a patched forward and attention is SDPA again."""
    runner = _runner(torch.float32)
    ContinuousEngine(runner, EngineConfig(2, batch_invariant=True)).run(make_requests([("a", 2)]))
    patched = [type(m).__name__ for m in runner.model.modules() if "forward" in vars(m)]
    assert patched == [], f"still patched: {patched}"
    assert runner.model.config._attn_implementation == "sdpa"


def test_tiles_are_one_row_only_for_emulated_half_precision():
    """1-row tiles where the kernel's cost grows with rows (half precision without oneDNN)."""
    assert invariant_ops.tile_rows_for("cpu", torch.bfloat16, "skinny") == 1
    assert invariant_ops.tile_rows_for("cpu", torch.float16, "skinny") == 1
    assert invariant_ops.tile_rows_for("cpu", torch.bfloat16, "onednn") == invariant_ops.TILE_ROWS
    assert invariant_ops.tile_rows_for("cpu", torch.float32, "skinny") == invariant_ops.TILE_ROWS
    assert invariant_ops.tile_rows_for("cuda", torch.bfloat16, "none") == invariant_ops.TILE_ROWS
