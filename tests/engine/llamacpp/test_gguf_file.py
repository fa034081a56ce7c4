"""The F32 GGUF's cache key: it follows the weights, so a changed model gets a new file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from engine.llamacpp.gguf_file import weights_key


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
