"""Parity on the embedded SmolLM2: the article's six requests at small caps, all engines."""

import pytest

from engine.config import EngineConfig
from engine.continuous import ContinuousEngine
from engine.model_runner import ModelRunner
from engine.reference import ReferenceCache
from engine.static import StaticEngine
from engine.workload import RequestSpec, seed_specs, tokenize_requests

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
