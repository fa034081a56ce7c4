"""The gemv kernels' packed copies gathered into one allocation (``linear_kernel.gather_packed``):
the copies lie end to end in the order a step reads them, the stacked qkv and gate_up run on
the modules' own copies, every byte is counted once, and the bits are those of loose copies."""

from __future__ import annotations

import math

import pytest
import torch
from family_models import PAST_WINDOW_SPECS, family_runner
from tiny_model import make_requests, step_logits, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.kernels import fused_layers, gemv_build, linear_kernel
from engine.kernels.kernel_plan import RowPlan
from engine.model.kernel_store import KernelChoice
from engine.model.memory_account import memory_account

pytestmark = pytest.mark.skipif(
    not gemv_build.available(), reason=f"not built here: {gemv_build.unavailable_reason()}"
)
PLAN = RowPlan((1, 17), ("gemv", "linear"))  # gemv for decode rows, as measured plans have it


def _linears(shapes: list[tuple[int, int]], dtype=torch.float32) -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    linears = [torch.nn.Linear(k, n, bias=False).to(dtype) for n, k in shapes]
    return [m.requires_grad_(False) for m in linears]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_gathered_copy_is_its_weights_packed_copy_end_to_end_in_one_allocation(dtype):
    """In the order given, each module's copy starts where the one before ends, in one storage,
    is bitwise ``pack(weight)`` (N not a multiple of 16 and odd K included), and its outputs are
    those of a kernel bound alone."""
    linears = _linears([(32, 24), (20, 7), (48, 24)], dtype)
    gathered = {m: linear_kernel.bind("gemv", m.weight) for m in linears}
    linear_kernel.gather_packed(list(gathered.values()))
    packed = [gathered[m].packed for m in linears]
    storage = packed[0].untyped_storage()
    assert all(p.untyped_storage().data_ptr() == storage.data_ptr() for p in packed)
    starts = [p.storage_offset() for p in packed]
    assert starts == [0, packed[0].numel(), packed[0].numel() + packed[1].numel()], starts
    assert storage.nbytes() == sum(g.extra_bytes for g in gathered.values())
    for m in linears:
        alone = linear_kernel.bind("gemv", m.weight)
        assert torch.equal(gathered[m].packed, alone.packed)
        assert linear_kernel.gemv_packed_shape(m.weight) == tuple(alone.packed.shape)
        x = torch.randn(3, m.in_features, dtype=dtype)
        assert torch.equal(gathered[m](x), alone(x))


def test_copies_end_to_end_join_into_the_stacked_weights_copy_and_others_do_not():
    """q, k, v gathered in that order: their joined view is bitwise the stacked weight's own
    packed copy; out of order, or with an N that is not a multiple of 16, there is no view."""
    q, k, v, odd = _linears([(64, 32), (32, 32), (32, 32), (20, 32)])
    gathered = {m: linear_kernel.bind("gemv", m.weight) for m in (q, k, v, odd)}
    linear_kernel.gather_packed(list(gathered.values()))
    joined = linear_kernel.joined_packed([gathered[m] for m in (q, k, v)])
    stacked = torch.cat([q.weight, k.weight, v.weight])
    assert joined is not None
    assert torch.equal(joined, linear_kernel.bind("gemv", stacked).packed)
    assert linear_kernel.joined_packed([gathered[m] for m in (q, v)]) is None  # k between
    assert linear_kernel.joined_packed([gathered[m] for m in (odd, q)]) is None  # N 20
    with pytest.raises(ValueError, match="not this weight's layout"):
        linear_kernel.GemvLinear(q.weight, None, packed=gathered[k].packed)


def _runner(family: str | None):
    runner = tiny_runner() if family is None else family_runner(family)
    runner.__dict__["kernel_choice"] = KernelChoice(PLAN, "measured")
    return runner


def _gemv(planned) -> linear_kernel.GemvLinear:
    return next(b for b in planned.bound if isinstance(b, linear_kernel.GemvLinear))


@pytest.mark.parametrize("family", [None, "gemma3"])
def test_a_runners_gemv_copies_lie_in_step_order_in_one_allocation_each_counted_once(family):
    """The fused layers' qkv, o, gate_up and down, layer by layer, then the LM head: views of
    one storage, each starting where the one before ends; the C++ step reads those views; the
    storage holds exactly the gemv bytes the memory account counts, and the modules' q, k, v,
    gate and up kernels run inside the stacks' views at no bytes of their own."""
    runner = _runner(family)
    decoder = runner.fused_decoder
    assert decoder.layers_step == "C++", decoder.layers_step
    head = runner.engine_kernel.modules.planned[runner.model.get_output_embeddings()]
    packed = [_gemv(p).packed for p in [*decoder.planned, head]]
    storage = packed[0].untyped_storage()
    assert all(p.untyped_storage().data_ptr() == storage.data_ptr() for p in packed)
    ends = [p.storage_offset() + p.numel() for p in packed]
    assert [p.storage_offset() for p in packed] == [0, *ends[:-1]], "not end to end in order"
    assert [p.data_ptr() for p in decoder.stack.packed] == [p.data_ptr() for p in packed[:-1]]
    account = memory_account(runner)
    assert storage.nbytes() == account["packed_bytes"]["gemv"] == ends[-1] * packed[0].itemsize
    stacked = [m for la in decoder.layers for m in (*la.spec.qkv, *la.spec.gate_up)]
    nbytes = [math.prod(linear_kernel.gemv_packed_shape(m.weight)) * 4 for m in stacked]
    assert decoder.extra_bytes == sum(nbytes), "the stacks count their modules' copies"
    for layer in decoder.layers:
        for module in (*layer.spec.qkv, *layer.spec.gate_up):
            own = _gemv(runner.engine_kernel.modules.planned[module])
            assert own.shares_packed and own.extra_bytes == 0
            assert own.packed.untyped_storage().data_ptr() == storage.data_ptr()


@pytest.mark.parametrize("family", [None, "gemma3"])
def test_steps_on_the_gathered_copies_have_the_bits_of_loose_copies(family):
    """Every step's logits (prefill and C++ decode steps, Gemma 3's paged cache in its global
    and sliding groups) are bitwise those of fused layers whose gemv kernels packed loose copies
    of their own, and the outputs equal per-request generate."""
    specs = PAST_WINDOW_SPECS
    gathered = _runner(family)
    config = EngineConfig(3, kv_mode="paged", block_size=4)
    requests = make_requests(specs)
    trace = ContinuousEngine(gathered, config).run(requests)
    reference = ReferenceCache(gathered).outputs(requests)
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], f"{family} R{r.request_id}"
    got = step_logits(gathered, config, specs)
    loose = _runner(family)
    loose.__dict__["fused_decoder"] = fused_layers.FusedDecoder(loose.model, PLAN)  # own copies
    storages = {p.untyped_storage().data_ptr() for p in loose.fused_decoder.stack.packed}
    assert len(storages) > 1, "the loose copies are one allocation too"
    want = step_logits(loose, config, specs)
    assert gathered.fused_decoder.stack.num_calls > 5 and loose.fused_decoder.stack.num_calls > 5
    assert len(got) == len(want) > 20
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
