"""Tiny random-weight models of each decoder family transformers ships, built offline from their
config classes, with the byte tokenizer of ``tiny_model``: seconds each, no download.

Each keeps what its family brings (QKV biases, QK-norm, norms around each block, GELU, scaled
embeddings, soft-capping, multipliers, NoPE layers, fused projections) and a sliding window of
``WINDOW`` keys where the family has one, so sequences of a few dozen tokens reach past it.
"""

from __future__ import annotations

import torch
from tiny_model import EOS_IDS, VOCAB, runner_of

from engine.model.model_runner import ModelRunner

WINDOW = 8  # keys a sliding-window layer sees
# Prompts and outputs up to 67 tokens, 8 windows; two requests share a 16-token prefix.
PAST_WINDOW_SPECS = [
    ("the quick brown fox jumps over the lazy dog", 24),
    ("a", 30),
    ("hello world", 6),
    ("z" * 20 + " abc", 12),
    ("the quick brown fox said hi", 18),
    ("q", 1),
]

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=list(EOS_IDS),
    pad_token_id=0,
    bos_token_id=None,
)
_GEMMA = dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16)

# family -> (config class, model class, config fields beside _COMMON)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _GEMMA),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", _GEMMA | dict(num_hidden_layers=3)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.5)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            logits_scaling=2.0,
            attention_multiplier=0.2,
        ),
    ),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layer_interval=2)),
}
# Gemma 3 alternates local and global layers: 2 sliding layers, then a global one.
_LAYER_TYPES = {"gemma3": ["sliding_attention", "sliding_attention", "full_attention"]}


def family_model(family: str, seed: int = 5, **overrides):
    """The tiny ``family`` model, float32, eval mode, with transformers' reference attention
    (SDPA, or eager for a family without it, as ``engine.model.loader`` picks); ``overrides``:
    config fields over the family's (``head_dim=32``, the narrowest vLLM's CPU attention takes)."""
    import transformers

    config_name, model_name, fields = FAMILIES[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**(_COMMON | fields | overrides))
    if family in _LAYER_TYPES:
        config.layer_types = _LAYER_TYPES[family]
    model_cls = getattr(transformers, model_name)
    config._attn_implementation = "sdpa" if model_cls._supports_sdpa else "eager"
    model = model_cls(config).eval()
    center = 0.0 if family.startswith("gemma") else 1.0  # Gemma's norms scale by 1 + w
    with torch.no_grad():  # norm weights apart from their init, so a misread scale shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(center, 0.2)
    return model


def family_runner(family: str, seed: int = 5) -> ModelRunner:
    """A ``ModelRunner`` over ``family_model`` with the byte tokenizer."""
    return runner_of(family_model(family, seed), f"tiny-{family}")


# The folder tokenizer: one token per character, the rest <unk>; ids 0 (pad), 1 and 2 (EOS).
_SPECIALS = ["<pad>", "</s>", "<eos>", "<unk>"]
_CHARS = " abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:;()TIQWRHAOSCEM\n"
_CHAT = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}:{% endif %}"
)


def save_family_folder(family: str, folder, **overrides) -> str:
    """``family_model`` (with ``overrides``) saved with ``save_pretrained`` beside a character
    tokenizer with a chat template: a folder ``--model`` loads as it loads a downloaded model.
    Returns its path."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(_SPECIALS + list(dict.fromkeys(_CHARS)))}
    assert len(vocab) == VOCAB, f"{len(vocab)} tokens for a vocabulary of {VOCAB}"
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = _CHAT
    family_model(family, **overrides).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
