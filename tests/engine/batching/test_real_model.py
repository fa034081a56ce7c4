"""Parity on the embedded SmolLM2: the article's six requests at small caps, all engines."""

import pytest

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.model.model_runner import ModelRunner
from engine.workloads.workload import RequestSpec, seed_specs, tokenize_requests

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def runner(embedded_model):
    return ModelRunner(embedded_model)


def _requests(runner, chat_template):
    specs = [RequestSpec(s.prompt, min(s.max_new_tokens, 12)) for s in seed_specs()]
    return tokenize_requests(
        specs,
        runner.tokenizer,
        chat_template=chat_template,
        max_context=runner.loaded.max_context,
    )


@pytest.mark.parametrize("chat_template", [False, True])
def test_seed_requests_match_generate_token_for_token(runner, chat_template):
    """Static and continuous (both KV modes) equal per-request model.generate on the real model."""
    requests = _requests(runner, chat_template)
    reference = ReferenceCache(runner).outputs(requests)
    engines = {
        "static": StaticEngine(runner, EngineConfig(3)),
        "continuous": ContinuousEngine(runner, EngineConfig(3)),
        "continuous_concat": ContinuousEngine(runner, EngineConfig(3, kv_mode="concat")),
    }
    for name, engine in engines.items():
        trace = engine.run(requests)
        for r in trace.requests:
            ref = reference[r.request_id]
            assert r.output_token_ids == ref, f"{name} R{r.request_id}: {r.output_text!r}"
            assert r.output_text == runner.decode(ref)


def _run_both(runner, prompts: list[str], cap: int):
    requests = tokenize_requests(
        [RequestSpec(p, cap) for p in prompts],
        runner.tokenizer,
        chat_template=False,
        max_context=runner.loaded.max_context,
    )
    reference = ReferenceCache(runner).outputs(requests)
    traces = [
        StaticEngine(runner, EngineConfig(2)).run(requests),
        ContinuousEngine(runner, EngineConfig(2)).run(requests),
    ]
    return requests, reference, traces


def test_eos_marker_text_in_a_prompt_is_text_and_does_not_stop(runner):
    """ "<|im_end|>" typed in a prompt is tokenized as text, attended to, and ends nothing."""
    eos_text = runner.tokenizer.decode(sorted(runner.eos_token_ids))
    prompt = f"Finish the list: apples{eos_text} pears, plums and"
    requests, reference, traces = _run_both(runner, [prompt], cap=4)
    ids = requests[0].prompt_token_ids
    assert not set(ids) & runner.eos_token_ids, f"EOS id in the prompt's tokens: {ids}"
    assert runner.tokenizer.decode(ids) == prompt, "the marker was not kept as text"
    without = runner.tokenizer(prompt.replace(eos_text, ""))["input_ids"]
    assert len(ids) > len(without), "the marker's text tokens are not in the prompt"
    for trace in traces:
        rec = trace.requests[0]
        assert rec.output_token_ids == reference[0], f"{trace.engine}: differs from generate"
        assert len(rec.output_token_ids) == 4 or rec.finish_reason == "eos", rec.finish_reason


def test_non_ascii_prompts_round_trip_and_output_text_is_the_decode(runner):
    """Accents, CJK, emoji, RTL: prompts decode back whole; output text is the ids' decode."""
    prompts = [
        "Café déjà vu, naïve",
        "東京の天気は",
        "Emoji time 🎉👍🏽 is",
        "שלום עולם",
        "مرحبا بالعالم",
    ]
    requests, reference, traces = _run_both(runner, prompts, cap=3)
    for request in requests:
        decoded = runner.tokenizer.decode(request.prompt_token_ids)
        assert decoded == request.prompt, f"{request.prompt!r} decodes as {decoded!r}"
    for trace in traces:
        for rec in trace.requests:
            assert rec.output_token_ids == reference[rec.request_id], f"{trace.engine} {rec}"
            text = runner.tokenizer.decode(rec.output_token_ids, skip_special_tokens=True)
            assert rec.output_text == text, f"{trace.engine} R{rec.request_id}: {rec.output_text!r}"
