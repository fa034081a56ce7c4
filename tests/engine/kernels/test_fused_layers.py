"""The fused decoder and the decode attention split: the model's own numbers, fewer ops."""

import pytest
import torch
from tiny_model import make_requests, step_logits, tiny_runner
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from transformers.models.olmo2.modeling_olmo2 import apply_rotary_pos_emb as olmo2_rotary

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.kernels import decode_attention, fused_layers, gemv_build, linear_kernel
from engine.kernels.kernel_plan import PlannedLinear, RowPlan
from engine.model.kernel_store import KernelChoice

HAS_ONEDNN = torch.backends.mkldnn.is_available()

# Prompts of very different lengths, so decode steps split (one long sequence among short ones).
SPECS = [("z" * 200, 30), ("a", 40), ("hello", 25), ("y" * 120, 10), ("q", 60), ("x" * 300, 8)]


def _logits_per_step(runner, kv_mode: str, num_slots: int) -> list[torch.Tensor]:
    return step_logits(runner, EngineConfig(num_slots, kv_mode=kv_mode, ignore_eos=True), SPECS)


@pytest.mark.parametrize("kv_mode", ["slots", "paged", "concat"])
def test_fused_layers_give_the_model_layers_bits_in_float32(kv_mode, monkeypatch):
    """Without the decode split, every step's logits are bitwise those of the model's modules."""
    runner = tiny_runner()
    monkeypatch.setattr(decode_attention, "plan_decode", lambda batch, dtype, **_: None)
    runner.use_fused_layers = False
    want = _logits_per_step(runner, kv_mode, 3)
    runner.use_fused_layers = True
    got = _logits_per_step(runner, kv_mode, 3)
    assert runner.fused_decoder is not None
    assert len(got) == len(want)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def _with_plan(runner, plan: RowPlan):
    """The runner as if its measurement had chosen ``plan``."""
    runner.__dict__["kernel_choice"] = KernelChoice(plan, "measured")
    return runner


MIXED = RowPlan((1, 3, 8), ("linear", "skinny", "onednn" if HAS_ONEDNN else "linear"))


@pytest.mark.parametrize(
    "plan",
    [RowPlan.single("linear"), RowPlan.single("skinny"), MIXED],
    ids=["linear", "skinny", "mixed"],
)
def test_fused_layers_give_the_model_layers_bits_for_every_plan(plan, monkeypatch):
    """With F.linear, skinny, or a plan switching kernels by row count, the fused layers' logits
    are bitwise those of the model's own modules through the same plan."""
    runner = _with_plan(tiny_runner(), plan)
    monkeypatch.setattr(decode_attention, "plan_decode", lambda batch, dtype, **_: None)
    runner.use_fused_layers = False
    want = _logits_per_step(runner, "slots", 3)
    runner.use_fused_layers = True
    got = _logits_per_step(runner, "slots", 3)
    assert runner.engine_kernel_name == plan.label and runner.fused_decoder is not None
    assert len(got) == len(want)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_the_fused_layers_follow_the_plans_row_ranges(monkeypatch):
    """Under a plan giving skinny 3 to 7 rows, the fused layers call skinny only at 3 to 7 rows,
    and do call it (steps of 3 decoding sequences)."""
    runner = _with_plan(tiny_runner(), MIXED)
    seen = []
    skinny = linear_kernel.skinny_linear

    def spy(x, weight, bias=None):
        seen.append(x.numel() // x.shape[-1])
        return skinny(x, weight, bias)

    monkeypatch.setattr(linear_kernel, "skinny_linear", spy)
    ContinuousEngine(runner, EngineConfig(3, ignore_eos=True)).run(make_requests(SPECS[:3]))
    assert runner.decoder_layers == "fused"
    assert seen and all(3 <= rows <= 7 for rows in seen), sorted(set(seen))


@pytest.mark.parametrize("kv_mode", ["slots", "paged"])
@pytest.mark.parametrize("num_slots", [3, 4])
def test_split_decode_steps_match_generate(kv_mode, num_slots, monkeypatch):
    """Decode steps that split attend alone where it pays, and outputs still equal generate (the
    split as a host without ``decode_step`` runs it)."""
    runner = tiny_runner()
    requests = make_requests(SPECS)
    reference = ReferenceCache(runner).outputs(requests)
    solo_counts = []
    plan = decode_attention.plan_decode

    def spy(batch, dtype, whole=True, fits=True):
        split = plan(batch, dtype, whole=False, fits=fits)
        solo_counts.append(0 if split is None else len(split.solo))
        return split

    monkeypatch.setattr(decode_attention, "plan_decode", spy)
    trace = ContinuousEngine(runner, EngineConfig(num_slots, kv_mode=kv_mode)).run(requests)
    assert max(solo_counts) >= 1, "no decode step split"
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], f"request {r.request_id}"


def test_split_decode_attention_is_the_padded_attention():
    """Split attention agrees with the one padded, masked call to float32 rounding."""
    runner = tiny_runner()
    runner.use_fused_layers = True
    got = _logits_per_step(runner, "slots", 4)
    runner.use_fused_layers = False
    want = _logits_per_step(runner, "slots", 4)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("lengths", "num_slots", "expected"),
    [
        ([50, 45, 40], 3, 0),  # even lengths: one shared call
        ([300, 40, 35], 3, 1),  # 128 + 300 + 128 + 3 * 40 = 676 < 128 + 3 * 300 = 1028
        ([260], 8, 1),  # alone in 8 slots: 128 + 260 < 128 + 8 * 260
        ([100, 100], 2, 0),  # 128 + 200 = 328 < 128 + 100 + 128 + 200 = 556
    ],
)
def test_the_split_minimizes_key_rows_plus_calls(lengths, num_slots, expected):
    """The number of solo calls is the cheapest one by the documented cost (worked by hand)."""
    assert decode_attention.CALL_COST_KEYS == 128
    assert decode_attention._best_num_solo(lengths, num_slots) == expected


@pytest.mark.parametrize(
    ("rotate", "dtype"),
    [(apply_rotary_pos_emb, torch.float32), (olmo2_rotary, torch.bfloat16)],
    ids=["llama", "olmo2"],
)
def test_folded_rotary_is_transformers_rotary_bitwise(rotate, dtype):
    """x * cos + flip(x) * signed_sin gives apply_rotary_pos_emb's bits for q and k; OLMo 2's
    float32 tables on bfloat16 q and k too (rotated in float32, cast back once)."""
    gen = torch.Generator().manual_seed(0)
    num_tokens, heads, kv_heads, head_dim = 5, 4, 2, 16
    q = torch.randn(1, heads, num_tokens, head_dim, generator=gen).to(dtype)
    k = torch.randn(1, kv_heads, num_tokens, head_dim, generator=gen).to(dtype)
    angles = torch.randn(1, num_tokens, head_dim, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    want_q, want_k = rotate(q, k, cos, sin)
    assert want_q.dtype == dtype
    qk = torch.cat([q[0], k[0]]).transpose(0, 1).contiguous()  # (T, H + H_kv, D)
    half = head_dim // 2
    signed_sin = torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1)[:, None]
    got = fused_layers._rotary(qk, cos[0, :, None], signed_sin)
    assert torch.equal(got[:, :heads].transpose(0, 1), want_q[0])
    assert torch.equal(got[:, heads:].transpose(0, 1), want_k[0])


@pytest.mark.skipif(not gemv_build.on_x86() or not HAS_ONEDNN, reason="oneDNN on x86 only")
@pytest.mark.parametrize("num_rows", [1, 3, 17])
def test_stacked_onednn_matmul_is_the_separate_ones_bitwise(num_rows):
    """[Wq; Wk; Wv] in one oneDNN matmul gives each projection's bits, the residual add too."""
    gen = torch.Generator().manual_seed(num_rows)
    linears = [nn.Linear(64, n, bias=False) for n in (64, 32, 32)]
    x = torch.randn(num_rows, 64, generator=gen)
    residual = torch.randn(num_rows, 128, generator=gen)
    stacked = PlannedLinear(linears, "onednn")
    separate = [
        linear_kernel.onednn_linear(x, linear_kernel.onednn_pack(m.weight)) for m in linears
    ]
    with torch.inference_mode():
        assert torch.equal(stacked(x), torch.cat(separate, -1))
        assert torch.equal(stacked.add(x, residual), residual + torch.cat(separate, -1))


def test_a_model_the_fused_layers_do_not_know_runs_through_its_own_layers():
    """A layer the fused layers cannot read (a LayerNorm where an RMSNorm was) gets none: the
    reason names it, the layers path says so, and the engine calls the model instead."""
    runner = tiny_runner()
    layer = runner.model.model.layers[1]
    with torch.no_grad():
        norm = torch.nn.LayerNorm(64, eps=1e-5)
        norm.weight.normal_(1.0, 0.2)
    layer.post_attention_layernorm = norm
    reason = fused_layers.unsupported_reason(runner.model)
    assert reason is not None and "post_attention_layernorm (LayerNorm)" in reason, reason
    with pytest.raises(ValueError, match="LayerNorm"):
        fused_layers.FusedDecoder(runner.model, "skinny")
    assert runner.fused_decoder is None
    assert runner.layers_path == f"transformers: {reason}"
    requests = make_requests(SPECS[:3])
    reference = ReferenceCache(runner).outputs(requests)
    trace = ContinuousEngine(runner, EngineConfig(3)).run(requests)
    assert {r.request_id: r.output_token_ids for r in trace.requests} == reference
    assert runner.decoder_layers == "transformers", runner.decoder_layer_steps


def test_fused_layers_on_free_kernels_keep_no_stacked_copy():
    """On ``linear`` the stacked q/k/v and gate/up run the modules' own F.linear one by one, so
    the fused layers add no plain stacked copy (a copy the copy budget does not count)."""
    runner = _with_plan(tiny_runner(), RowPlan.single("linear"))
    ContinuousEngine(runner, EngineConfig(2)).run(make_requests(SPECS[:2]))
    assert runner.fused_decoder is not None
    assert runner.fused_decoder.extra_bytes == 0, "the fused layers stacked a plain copy"
    assert runner.engine_kernel_bytes == 0


def test_cbp_fused_layers_off_runs_transformers_layers_and_counts_the_steps(monkeypatch):
    """CBP_FUSED_LAYERS=off: every step goes through the model's own layers, outputs unchanged."""
    monkeypatch.setenv("CBP_FUSED_LAYERS", " OFF ")
    runner = tiny_runner()
    requests = make_requests(SPECS[:3])
    reference = ReferenceCache(runner).outputs(requests)
    trace = ContinuousEngine(runner, EngineConfig(3)).run(requests)
    assert {r.request_id: r.output_token_ids for r in trace.requests} == reference
    assert runner.decoder_layer_steps == {"fused": 0, "transformers": len(trace.steps)}
    assert runner.decoder_layers == "transformers"
    monkeypatch.delenv("CBP_FUSED_LAYERS")
    runner = tiny_runner()
    assert runner.decoder_layers is None
    trace = ContinuousEngine(runner, EngineConfig(3)).run(requests)
    assert runner.decoder_layer_steps == {"fused": len(trace.steps), "transformers": 0}
    assert runner.decoder_layers == "fused"


def test_a_bad_cbp_fused_layers_is_refused_naming_the_variable(monkeypatch):
    """A CBP_FUSED_LAYERS value other than auto or off is a ValueError that names it."""
    monkeypatch.setenv("CBP_FUSED_LAYERS", "fast")
    with pytest.raises(ValueError, match="CBP_FUSED_LAYERS='fast'"):
        tiny_runner()
