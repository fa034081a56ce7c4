"""The F32 GGUF's cache key: it follows the weights, so a changed model gets a new file; a
model the converter cannot read is refused with its reason."""

from __future__ import annotations

import json

import pytest
import torch
from family_models import save_family_folder
from safetensors.torch import save_file

from engine.llamacpp.gguf_file import f32_gguf, weights_key
from engine.peers.endpoints import ModelRefused
from tests.live_servers import needs_llamacpp


def _folder(path, value: float):
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.full((4, 4), value)}, str(path / "model.safetensors"))
    return path


def test_key_follows_the_weights(tmp_path):
    """The same weights give the same key wherever they lie; one changed value changes it."""
    first = weights_key(_folder(tmp_path / "a", 1.0))
    assert weights_key(_folder(tmp_path / "b", 1.0)) == first, "same weights, another key"
    assert weights_key(_folder(tmp_path / "a", 1.5)) != first, "changed weights, same key"


def test_a_folder_without_weights_is_refused(tmp_path):
    """A folder with no safetensors file is refused with a message naming what is missing."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a safetensors model folder"):
        weights_key(tmp_path)


@needs_llamacpp
def test_a_model_the_converter_cannot_read_is_refused_saying_why(tmp_path):
    """A folder llama.cpp's converter fails on (a tokenizer it does not know) is ModelRefused:
    the message has the converter's own words and the folder; ``public`` has its last line and
    no host path, for a page's servers line."""
    folder = save_family_folder("qwen3", tmp_path / "qwen3")
    with pytest.raises(ModelRefused) as refused:
        f32_gguf(folder)
    assert "llama.cpp's converter failed on" in str(refused.value) and folder in str(refused.value)
    public = refused.value.public
    assert public.startswith("llama.cpp's converter cannot convert this model (")
    assert public.endswith(")")
    assert str(tmp_path) not in public, public
