"""The bench's knob flags parse with the page's and the /run API's parser
(``engine.knob_values``): the same value, and for a bad one the same message."""

from __future__ import annotations

import pytest

from engine.bench.args import parse_args
from engine.knob_values import knob_value
from engine.knobs import KNOB


@pytest.mark.parametrize(
    ("flag", "dest", "text"),
    [
        ("--token-budget", "token_budget", "0"),  # no limit, as on the page (was a budget of 0)
        ("--token-budget", "token_budget", "64"),
        ("--kv-budget-mib", "kv_budget_mib", "0"),  # room for every slot (was refused)
        ("--kv-budget-mib", "kv_budget_mib", "1.5"),
        ("--block-size", "block_size", "32.0"),
        ("--slots", "slots", "4"),
        ("--policy", "policy", "vllm"),
    ],
)
def test_a_flag_reads_as_the_page_reads_its_knob(flag, dest, text):
    """``--token-budget 0`` means no limit, as 0 does on the page."""
    knob = next(k for k in KNOB.values() if k.bench_flag == flag)
    assert getattr(parse_args([flag, text]), dest) == knob_value(knob, text)


def test_a_bad_flag_value_gets_the_pages_message(capsys):
    """argparse says what the page would: the knob's name, and what it must be."""
    with pytest.raises(SystemExit):
        parse_args(["--token-budget", "2.5"])
    err = capsys.readouterr().err
    assert "argument --token-budget: Token budget must be a whole number (got '2.5')." in err, err
