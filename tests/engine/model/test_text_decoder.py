"""A vision-language checkpoint (Gemma 3 4B's shape, tiny) runs on its text decoder: the
engines equal the whole model's own ``generate`` on text prompts, past the sliding window."""

import pytest
import torch
from family_models import _COMMON, _GEMMA, PAST_WINDOW_SPECS, save_family_folder
from tiny_model import make_requests, runner_of

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.model.loader import load_model
from engine.model.text_decoder import text_decoder


def _vision_language_model():
    """A tiny ``Gemma3ForConditionalGeneration``: a 3-layer Gemma 3 decoder (2 sliding, 1
    global) beside a 1-layer vision tower, random weights, float32."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(3)
    text = _COMMON | _GEMMA | dict(num_hidden_layers=3)
    text["layer_types"] = ["sliding_attention", "sliding_attention", "full_attention"]
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=60,
        boi_token_index=61,
        eoi_token_index=62,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms apart from 0 so that a misread ``1 + w`` scale shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module")
def whole():
    return _vision_language_model()


def test_the_text_decoder_shares_the_whole_models_weights(whole):
    """The text decoder is the text family's causal LM over the same tensors, nothing copied."""
    decoder = text_decoder(whole)
    assert type(decoder).__name__ == "Gemma3ForCausalLM", type(decoder).__name__
    assert decoder.lm_head.weight.data_ptr() == whole.lm_head.weight.data_ptr()
    first = decoder.model.layers[0].self_attn.q_proj.weight
    assert (
        first.data_ptr() == whole.model.language_model.layers[0].self_attn.q_proj.weight.data_ptr()
    )


def test_engines_on_the_text_decoder_equal_the_whole_models_generate(whole):
    """Continuous (slots and paged) on the text decoder equals the vision-language model's own
    greedy ``generate`` on each text prompt, token for token, past the window of 8."""
    runner = runner_of(text_decoder(whole), "tiny-gemma3-vl")
    requests = make_requests(PAST_WINDOW_SPECS)
    expected = {}
    for r in requests:
        ids = torch.tensor([r.prompt_token_ids])
        out = whole.generate(ids, max_new_tokens=r.max_new_tokens, do_sample=False)
        expected[r.request_id] = _until_eos(out[0, ids.shape[1] :].tolist(), runner.eos_token_ids)
    for config in (EngineConfig(3), EngineConfig(3, kv_mode="paged", block_size=4)):
        trace = ContinuousEngine(runner, config).run(requests)
        for r in trace.requests:
            want = expected[r.request_id]
            assert r.output_token_ids == want, f"{config.kv_mode} R{r.request_id}: {want}"


def test_load_model_takes_a_vision_language_folder_as_its_text_decoder(whole, tmp_path):
    """``--model FOLDER`` on a saved vision-language checkpoint loads its text decoder, where it
    crashed in the KV cache's sizing (``Gemma3Config`` has no ``hidden_size``)."""
    folder = save_family_folder("gemma3", tmp_path / "vl")  # its tokenizer; the model replaced
    whole.save_pretrained(folder)
    loaded = load_model(folder, device="cpu")
    assert loaded.model.config.model_type == "gemma3_text", loaded.model.config.model_type
    assert loaded.model.config.hidden_size == 64


def _until_eos(tokens: list[int], eos_ids) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens
