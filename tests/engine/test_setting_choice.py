"""A host setting names one of its choices; unset means its default, anything else is refused."""

import pytest

from engine.settings import choice as read_choice

NAME = "CBP_FUSED_LAYERS"  # a declared choice setting whose default is "auto"
CHOICES = {"auto": "the usual", "off": "none of it"}


def test_unset_or_empty_gives_the_default(monkeypatch):
    """An unset or blank variable reads as its declared default."""
    monkeypatch.delenv(NAME, raising=False)
    assert read_choice(NAME, CHOICES) == "auto", "unset did not give the default"
    monkeypatch.setenv(NAME, "  ")
    assert read_choice(NAME, CHOICES) == "auto", "blank did not give the default"


def test_a_choice_is_read_whatever_its_case(monkeypatch):
    """Case and surrounding spaces do not matter."""
    monkeypatch.setenv(NAME, " OFF ")
    assert read_choice(NAME, CHOICES) == "off", "' OFF ' was not read as 'off'"


def test_an_unknown_value_names_the_variable_and_every_choice(monkeypatch):
    """A value outside the choices is refused, naming the variable and every choice."""
    monkeypatch.setenv(NAME, "fast")
    message = f"{NAME}='fast': use 'auto' \\(the usual\\) or 'off' \\(none of it\\)"
    with pytest.raises(ValueError, match=message):
        read_choice(NAME, CHOICES)
