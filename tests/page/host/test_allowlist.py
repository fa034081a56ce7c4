"""Hosted safety for models: the allowlist is checked before any load; remote code is never on."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_model import tiny_model

from engine.model import loader
from engine.model.allowlist import allowed_models, check_model_allowed
from engine.model.loader import ModelLoadError
from engine.page.run import shared_model
from engine.worker import worker_model

ENGINE_SOURCES = sorted((Path(__file__).resolve().parents[3] / "engine").rglob("*.py"))


@pytest.fixture
def no_load(monkeypatch):
    """Any model load fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a model load started")

    monkeypatch.setattr(worker_model, "load_model", forbidden)


def test_default_allowlist_is_the_embedded_model_alone(monkeypatch, no_load):
    """Unset, only "embedded" (or no --model) passes; a hub id is refused before loading."""
    monkeypatch.delenv("CBP_MODEL_ALLOWLIST", raising=False)
    assert allowed_models() == ["embedded"]
    check_model_allowed(None)
    check_model_allowed("Embedded")
    with pytest.raises(ModelLoadError, match="not on this app's allowlist") as caught:
        shared_model.load_shared_model("HuggingFaceTB/SmolLM2-360M-Instruct", "cpu")
    assert "CBP_MODEL_ALLOWLIST=embedded,HuggingFaceTB/SmolLM2-360M-Instruct" in str(caught.value)


def test_host_allowlist_from_the_environment(monkeypatch):
    """CBP_MODEL_ALLOWLIST lists ids (spaces ignored); "*" allows any; others stay refused."""
    monkeypatch.setenv("CBP_MODEL_ALLOWLIST", " org/a , ./local-folder ")
    assert allowed_models() == ["org/a", "./local-folder"]
    check_model_allowed("org/a")
    check_model_allowed("./local-folder")
    for refused in ("org/b", "embedded", "org/a/../b"):
        with pytest.raises(ModelLoadError, match="allowlist"):
            check_model_allowed(refused)
    monkeypatch.setenv("CBP_MODEL_ALLOWLIST", "*")
    check_model_allowed("anything/at-all")


def test_every_from_pretrained_call_refuses_remote_code():
    """Every ``from_pretrained`` call in engine/ passes ``trust_remote_code=False`` literally."""
    calls = []
    for path in ENGINE_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "from_pretrained":
                kwargs = {k.arg: k.value for k in node.keywords}
                value = kwargs.get("trust_remote_code")
                ok = isinstance(value, ast.Constant) and value.value is False
                calls.append((f"{path.name}:{node.lineno}", ok))
    assert len(calls) >= 3, f"expected the loader's from_pretrained calls, found {calls}"
    assert all(ok for _, ok in calls), f"calls without trust_remote_code=False: {calls}"


def test_loading_a_folder_never_turns_remote_code_on(monkeypatch, tmp_path):
    """A real folder load: every transformers from_pretrained sees trust_remote_code=False."""
    import transformers

    tiny_model().save_pretrained(tmp_path / "tiny")
    seen = []
    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained

        def recording(*args, _original=original, _name=cls.__name__, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code")))
            return _original(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", recording)

    def fake_tokenizer(*args, **kwargs):
        seen.append(("AutoTokenizer", kwargs.get("trust_remote_code")))
        return SimpleNamespace(pad_token="<pad>", eos_token="</s>", eos_token_id=2)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)
    loaded = loader.load_model(str(tmp_path / "tiny"), device="cpu")
    assert loaded.max_context == 512, "the tiny model did not load"
    names = {name for name, _ in seen}
    assert {"AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"} <= names, seen
    assert all(flag is False for _, flag in seen), f"trust_remote_code not False: {seen}"
