"""The README's Hugging Face Spaces front matter is valid and agrees with requirements.txt."""

from __future__ import annotations

import re

import yaml
from server_kit import REPO_ROOT

REQUIRED_KEYS = {
    "title",
    "emoji",
    "colorFrom",
    "colorTo",
    "sdk",
    "sdk_version",
    "app_file",
    "python_version",
    "short_description",
}
SPACE_COLORS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}


def _front_matter() -> dict:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    match = re.match(r"---\n(.*?)\n---\n", text, re.DOTALL)
    assert match, "README.md does not start with a --- YAML front matter block"
    return yaml.safe_load(match.group(1))


def _pinned(package: str) -> str:
    text = (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.MULTILINE))
    assert package in pins, f"requirements.txt does not pin {package}"
    return pins[package]


def test_front_matter_has_every_spaces_key():
    """The front matter names the sdk, app file, Python version, title, emoji, colours and text."""
    meta = _front_matter()
    assert REQUIRED_KEYS <= set(meta), f"missing keys: {REQUIRED_KEYS - set(meta)}"
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py", meta
    assert (REPO_ROOT / meta["app_file"]).is_file(), "app_file does not exist"
    assert isinstance(meta["python_version"], str), "python_version must be quoted (3.10 != 3.1)"
    assert {meta["colorFrom"], meta["colorTo"]} <= SPACE_COLORS, "colours Spaces does not accept"
    assert len(meta["short_description"]) <= 60, "Spaces caps short_description at 60 characters"


def test_sdk_version_matches_the_gradio_pin():
    """sdk_version is the gradio version requirements.txt installs."""
    meta = _front_matter()
    assert str(meta["sdk_version"]) == _pinned("gradio"), (
        f"front matter sdk_version {meta['sdk_version']} != requirements gradio {_pinned('gradio')}"
    )
