"""The per-request sampler: one request's next tokens, drawn from that request's own generator after
transformers' warpers, so its text depends on nothing else (docs/engines.md, "Sampling")."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams, samples


class RequestSampler:
    def __init__(self, params: SamplingParams):
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        assert samples(params), "a greedy request gets no sampler"
        self.params = params
        self.num_draws = 0
        self._generator: torch.Generator | None = None  # made on the logits' device at first use
        self._warpers = []  # the order of GenerationMixin._get_logits_processor
        if params.temperature != 1.0:
            self._warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k != 0:
            self._warpers.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
        if params.top_p < 1.0:
            self._warpers.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))

    def sample(self, logits: torch.Tensor, draw_index: int) -> int:
        """The token at output position ``draw_index`` (0-based).
        Shapes: logits: [V] (any float dtype)  ->  returns one token id"""
        assert draw_index == self.num_draws, (
            f"draw {draw_index} asked of a sampler that made {self.num_draws} draws"
        )
        if self._generator is None:
            self._generator = torch.Generator(device=logits.device)
            self._generator.manual_seed(self.params.seed)
        scores = logits.to(dtype=torch.float32, copy=True).unsqueeze(0)  # (1, V), as generate
        for warper in self._warpers:
            scores = warper(None, scores)  # the warpers do not read input_ids
        probs = torch.nn.functional.softmax(scores, dim=-1)  # (1, V)
        token = torch.multinomial(probs, num_samples=1, generator=self._generator)  # (1, 1)
        self.num_draws += 1
        return int(token)


def new_samplers(requests) -> dict[int, RequestSampler]:
    return {r.request_id: RequestSampler(r.sampling) for r in requests if r.is_sampled}


class WaveSampler:
    """A static wave's logits processor: a sampled row scores 0 at its sampler's token and -inf
    elsewhere, so ``generate``'s argmax picks it; greedy rows pass. Ended rows draw too, so draws
    equal generated tokens."""

    def __init__(self, samplers: list[RequestSampler | None], width: int):
        """``samplers``: one per row (None: greedy); ``width``: the padded prompt."""
        self.samplers = samplers
        self.width = width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Shapes: input_ids [B, W + k], scores [B, V] float32  ->  returns [B, V]"""
        draw_index = input_ids.shape[1] - self.width  # tokens generated so far
        scores = scores.clone()
        for row, sampler in enumerate(self.samplers):
            if sampler is None:
                continue
            token = sampler.sample(scores[row], draw_index)
            scores[row] = -torch.inf
            scores[row, token] = 0.0
        return scores


def generate_options(params: SamplingParams, model) -> dict:
    """``GenerationConfig`` fields to sample with exactly these settings; every other knob neutral
    (transformers would add ``top_k=50``)."""
    own = model.generation_config
    extra = [name for name in ("min_p", "top_h") if getattr(own, name, None) is not None]
    assert not extra, f"the model's generation config sets {extra}, which would add warpers"
    return {
        "do_sample": True,
        "temperature": float(params.temperature),
        "top_k": params.top_k,
        "top_p": float(params.top_p),
        "typical_p": 1.0,
        "epsilon_cutoff": 0.0,
        "eta_cutoff": 0.0,
        "repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0,
        "min_length": 0,
    }


def forked_rng(device: torch.device, enabled: bool = True):
    """Context: the global random state of the CPU and of ``device`` is restored on exit."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[], enabled=enabled)
    index = device.index if device.index is not None else 0
    return torch.random.fork_rng(devices=[index], enabled=enabled, device_type=device.type)


# transformers' manager makes a per-request processor only for a knob whose generation-config value
# is active (temperature not 1, top_k not 0, top_p below 1); every request then passes its own.
HF_SAMPLING_PLACEHOLDERS = {"do_sample": True, "temperature": 0.5, "top_k": 1, "top_p": 0.5}


def hf_request_kwargs(params: SamplingParams | None, vocab_size: int) -> dict:
    """``add_request`` keywords for transformers' per-request processors; a greedy request passes
    ``top_k=1`` (the argmax)."""
    if not samples(params):
        return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    top_k = min(params.top_k, vocab_size) if params.top_k else vocab_size
    return {"temperature": float(params.temperature), "top_k": top_k, "top_p": float(params.top_p)}
