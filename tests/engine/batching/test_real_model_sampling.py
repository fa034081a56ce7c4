"""Sampling on the embedded SmolLM2: our engines equal seeded ``generate``, token for token."""

import pytest
import torch

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.model.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.sequence import truncate_at_stop
from engine.workloads.workload import RequestSpec, seed_specs, tokenize_requests

pytestmark = pytest.mark.real_model
SETTINGS = [
    SamplingParams(0.8, 50, 0.95, 11),
    None,
    SamplingParams(1.0, 0, 1.0, 2024),
    SamplingParams(1.2, 0, 0.9, 3),
]


@pytest.fixture(scope="module")
def runner(embedded_model):
    return ModelRunner(embedded_model)


@pytest.fixture(scope="module")
def requests(runner):
    specs = [
        RequestSpec(spec.prompt, 10, 0.0, params)
        for spec, params in zip(seed_specs(), SETTINGS, strict=False)
    ]
    return tokenize_requests(
        specs, runner.tokenizer, chat_template=False, max_context=runner.loaded.max_context
    )


def _seeded_generate(runner, request) -> list[int]:
    """``generate`` run alone after ``torch.manual_seed(seed)``, written out here."""
    ids = torch.tensor([request.prompt_token_ids], device=runner.device)
    options = {"do_sample": False}
    if request.is_sampled:
        p = request.sampling
        options = {"do_sample": True, "temperature": p.temperature, "top_k": p.top_k}
        options["top_p"] = p.top_p
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        if request.is_sampled:
            torch.manual_seed(request.sampling.seed)
        out = runner.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=request.max_new_tokens,
            eos_token_id=sorted(runner.eos_token_ids),
            pad_token_id=runner.pad_token_id,
            **options,
        )
    tokens = out[0, ids.shape[1] :].tolist()
    return truncate_at_stop(tokens, request.max_new_tokens, runner.eos_token_ids)


def test_sampled_requests_equal_seeded_generate_on_the_real_model(runner, requests):
    """Static and continuous (1 and 3 slots) give seeded generate's tokens, greedy row included."""
    truth = {r.request_id: _seeded_generate(runner, r) for r in requests}
    assert truth[0] != truth[2]
    engines = {
        "static": StaticEngine(runner, EngineConfig(3)),
        "continuous@1": ContinuousEngine(runner, EngineConfig(1)),
        "continuous@3": ContinuousEngine(runner, EngineConfig(3)),
    }
    for name, engine in engines.items():
        trace = engine.run(requests)
        for r in trace.requests:
            assert r.output_token_ids == truth[r.request_id], f"{name} R{r.request_id}"
