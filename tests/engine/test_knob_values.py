"""Each kind's parser (``engine.knob_values``): what it takes, what it refuses and how it names the
knob, for the page, the /run API, the bench and links alike."""

from __future__ import annotations

import pytest

from engine.knob_values import LINK_WORDS, flag, knob_value, number, whole_number
from engine.knobs import KNOB


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("token_budget", "8", 8),
        ("token_budget", 8.0, 8),
        ("token_budget", "0", None),  # 0: no limit
        ("token_budget", " ", None),
        ("block_size", None, 16),  # blank: the default
        ("kv_budget_mib", "1.5", 1.5),
        ("kv_budget_mib", "0.00", None),  # room for every slot
        ("arrival_rate", 2, 2.0),
        ("policy", " vllm ", "vllm"),
        ("dtype", "", None),
        ("chat_template", "TRUE", True),
        ("chat_template", 0, False),
        ("chat_template", None, False),
    ],
)
def test_values_parse_by_kind(name, value, expected):
    """A value of each kind, as a widget, an API client or the bench sends it."""
    assert knob_value(KNOB[name], value) == expected


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("token_budget", "abc", "Token budget must be a whole number (got 'abc')."),
        ("block_size", "2.5", "Block size must be a whole number (got '2.5')."),
        ("block_size", "inf", "Block size must be a whole number (got 'inf')."),
        ("arrival_rate", "-1", "Arrival rate (requests/s) must be positive"),
        ("arrival_rate", "inf", "Arrival rate (requests/s) must be a number (got 'inf')."),
        ("kv_budget_mib", "nan", "KV budget (MiB) must be a number (got 'nan')."),
        ("batch_invariant", "on", "Batch-invariant mode must be true or false (got 'on')."),
        ("compare_hf", 2, "must be true or false (got 2)."),
    ],
)
def test_bad_values_are_refused_naming_the_knob(name, value, message):
    """A bad value raises one ValueError whose message names the knob and the value; an
    infinite rate or KV budget is no number (it was read as one before)."""
    with pytest.raises(ValueError) as refused:
        knob_value(KNOB[name], value)
    assert message in str(refused.value)


def test_a_links_words_are_the_same_parser_with_more_words():
    """A link's "on", "yes", "1" are the flag parser's, given the link's words; the API's
    default words refuse them."""
    assert [flag(w, "x", LINK_WORDS) for w in ("on", "yes", "1", "Off", "no", "0")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="must be true or false"):
        flag("yes", "x")
    assert (whole_number("3.0", "x"), number("0", "x")) == (3, 0.0)
