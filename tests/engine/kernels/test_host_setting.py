"""A host setting names one of its choices; unset means the first, anything else is refused."""

import pytest

from engine.kernels.host_setting import read_choice

CHOICES = {"auto": "the usual", "off": "none of it"}


def test_unset_or_empty_gives_the_first_choice(monkeypatch):
    monkeypatch.delenv("CBP_TEST_CHOICE", raising=False)
    assert read_choice("CBP_TEST_CHOICE", CHOICES) == "auto"
    monkeypatch.setenv("CBP_TEST_CHOICE", "  ")
    assert read_choice("CBP_TEST_CHOICE", CHOICES) == "auto"


def test_a_choice_is_read_whatever_its_case(monkeypatch):
    monkeypatch.setenv("CBP_TEST_CHOICE", " OFF ")
    assert read_choice("CBP_TEST_CHOICE", CHOICES) == "off"


def test_an_unknown_value_names_the_variable_and_every_choice(monkeypatch):
    monkeypatch.setenv("CBP_TEST_CHOICE", "fast")
    message = "CBP_TEST_CHOICE='fast': use 'auto' \\(the usual\\) or 'off' \\(none of it\\)"
    with pytest.raises(ValueError, match=message):
        read_choice("CBP_TEST_CHOICE", CHOICES)
