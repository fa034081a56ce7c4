"""Verdicts: a hand-made near-tie, a hand-made real difference, and margins from the reference's
own pass on the tiny model."""

import pytest
import torch
from tiny_model import make_requests, tiny_runner

from engine.fidelity.divergence import (
    DIFFERS,
    MATCH,
    NEAR_TIE,
    RoundingModel,
    judge,
    rounding_model,
    unit_roundoff,
)
from engine.fidelity.reference import ReferenceCache
from engine.token_logits import LogitTrail, TokenLogits
from engine.trace import Trace, new_request_records

HIDDEN = 576  # SmolLM2-135M's hidden size
BF16 = RoundingModel(2.0**-8, HIDDEN)
FP32 = RoundingModel(2.0**-24, HIDDEN)


def _logits(pairs, abs_dot=70.0, digest="d"):
    """A hand-made ``TokenLogits``: (token, logit) pairs, best first."""
    ids, values = zip(*pairs, strict=True)
    return TokenLogits(ids, values, (abs_dot,) * len(ids), 48.0, digest)


def _error(u: float, abs_dot: float, logit: float) -> float:
    """e_v of the module docstring, written out here: (u + gamma_d) A_v + u |z_v|."""
    d_u = HIDDEN * 2.0**-24
    return (u + d_u / (1 - d_u)) * abs_dot + u * abs(logit)


def test_unit_roundoffs_are_half_an_epsilon():
    """u is 2**-24, 2**-11 and 2**-8 for float32, float16 and bfloat16."""
    assert unit_roundoff(torch.float32) == 2.0**-24
    assert unit_roundoff(torch.float16) == 2.0**-11
    assert unit_roundoff(torch.bfloat16) == 2.0**-8
    assert rounding_model(torch.bfloat16, 64).unit_roundoff == 2.0**-8


def test_a_flip_within_both_runs_rounding_is_a_near_tie():
    """Reference 20.0 vs 19.875, engine 19.9375 vs 20.0 in bfloat16: ≈, with the derived bound."""
    reference = [5, 7, 9, 11]
    output = [5, 7, 12, 4]
    ref_run = [_logits([(5, 30.0), (1, 20.0)])] * 2 + [_logits([(9, 20.0), (12, 19.875)])]
    eng_run = [_logits([(5, 30.0), (1, 20.0)])] * 2 + [_logits([(12, 20.0), (9, 19.9375)])]
    verdict = judge(3, output, reference, ref_run, eng_run, BF16)
    assert verdict.verdict == NEAR_TIE, verdict.reason
    assert (verdict.token_index, verdict.reference_token, verdict.engine_token) == (2, 9, 12)
    assert verdict.logit_margin == 0.125 and verdict.engine_margin == 0.0625
    u = 2.0**-8
    expected = _error(u, 70, 20.0) + _error(u, 70, 19.875) + _error(u, 70, 19.9375)
    expected += _error(u, 70, 20.0)
    assert verdict.rounding_bound == pytest.approx(expected, rel=1e-12)
    assert (verdict.symbol, verdict.label) == ("≈", "≈ near-tie at token 2")
    view = verdict.to_dict(lambda ids: f"<{ids[0]}>")
    assert view["reference_run"]["top"][0] == {"token_id": 9, "logit": 20.0, "text": "<9>"}
    assert view["engine_run"]["reference_token_logit"] == 19.9375
    assert view["engine_run"]["engine_token_logit"] == 20.0


def test_a_margin_beyond_the_rounding_bound_differs():
    """A 3-logit lead lost in the engine is ✗ in bfloat16; 0.05 is ≈ in bfloat16, ✗ in float32."""
    ref_run = [_logits([(9, 23.0), (12, 20.0)])]
    eng_run = [_logits([(12, 21.0), (9, 20.5)])]
    verdict = judge(0, [12], [9], ref_run, eng_run, BF16)
    assert verdict.verdict == DIFFERS and verdict.label == "✗ differs at token 0"
    assert verdict.logit_margin == 3.0 and verdict.rounding_bound < 3.5
    close_ref = [_logits([(9, 20.05), (12, 20.0)])]
    close_eng = [_logits([(12, 20.0), (9, 20.0)])]
    assert judge(0, [12], [9], close_ref, close_eng, BF16).verdict == NEAR_TIE
    assert judge(0, [12], [9], close_ref, close_eng, FP32).verdict == DIFFERS


def test_tokens_outside_the_recorded_top_differ_unless_looked_up():
    """An engine token not in the reference's top K is ✗ unless the reference's pass gives it."""
    ref_run = [_logits([(9, 20.0), (3, 19.5)])]
    eng_run = [_logits([(12, 20.0), (9, 19.99)])]
    verdict = judge(0, [12], [9], ref_run, eng_run, BF16)
    assert verdict.verdict == DIFFERS and "not in the reference's top 2" in verdict.reason
    looked_up = judge(0, [12], [9], ref_run, eng_run, BF16, lambda k, t: (19.95, 70.0))
    assert looked_up.verdict == NEAR_TIE and looked_up.logit_margin == pytest.approx(0.05)


def test_matches_say_whether_the_logits_were_bitwise_equal():
    """Same tokens: ✓; logits_equal compares the rows' digests (None when one run has none)."""
    same = [_logits([(1, 2.0), (2, 1.0)], digest="a")]
    other = [_logits([(1, 2.0), (2, 1.0)], digest="b")]
    assert judge(0, [1], [1], same, same, BF16).logits_equal is True
    assert judge(0, [1], [1], same, other, BF16).logits_equal is False
    missing = judge(0, [1], [1], same, None, BF16)
    assert (missing.verdict, missing.logits_equal, missing.symbol) == (MATCH, None, "✓")


def test_an_output_that_ends_early_differs():
    """An output that stops where the reference goes on is ✗ at that position."""
    verdict = judge(0, [1, 2], [1, 2, 3], [_logits([(1, 2.0), (2, 1.0)])] * 3, None, BF16)
    assert (verdict.verdict, verdict.token_index, verdict.engine_token) == (DIFFERS, 2, None)


def test_a_logit_trail_gives_back_what_was_appended():
    """LogitTrail stores records compactly and returns them equal, by index and by slice."""
    rows = [
        TokenLogits((4, 9), (20.5, 19.25), (70.125, 65.5), 48.0, "00ff00ff"),
        TokenLogits((1, 2), (-3.0, -3.5), (1.5, 2.25), 0.5, "89abcdef"),
    ]
    trail = LogitTrail(rows)
    assert len(trail) == 2 and trail[0] == rows[0] and trail[-1] == rows[1]
    assert trail[0:2] == rows and list(trail) == rows
    with pytest.raises(IndexError):
        trail[2]


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=5)


def test_the_margin_is_measured_on_the_reference_run_itself(runner):
    """A changed token's margin is the reference generate's own logits gap (transformers'
    output_logits), never negative, also for a token outside the recorded top 8."""
    (request,) = make_requests([("the quick brown fox jumps", 12)])
    cache = ReferenceCache(runner)
    ref = cache.output(request)
    ids = torch.tensor([request.prompt_token_ids])
    with torch.inference_mode():
        gen = runner.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=len(ref),
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=sorted(runner.eos_token_ids),
            pad_token_id=runner.pad_token_id,
        )
    at = len(ref) // 2
    step = gen.logits[at][0].float()  # (V,): the reference's own logits at position `at`
    order = step.argsort(descending=True).tolist()
    for rank in (1, 20):  # the runner-up, and a token far outside the top 8
        token = order[rank]
        changed = [*ref[:at], token, *ref[at + 1 :]]
        trace = Trace(engine="edited", num_slots=1, requests=new_request_records([request]))
        trace.requests[0].output_token_ids = changed
        verdict = cache.verdicts([request], trace)[request.request_id]
        assert verdict.token_index == at and verdict.engine_token == token
        expected = float(step[ref[at]]) - float(step[token])
        assert verdict.logit_margin == expected, f"rank {rank}: not the reference's own gap"
        assert verdict.logit_margin >= 0, "the reference's own choice cannot trail"
