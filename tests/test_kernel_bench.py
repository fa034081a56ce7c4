"""The kernel micro-benchmark CLI: a row per row count, bad flags refused."""

import pytest

from engine import kernel_bench


def test_prints_a_row_per_row_count_without_lm_head(tiny_loaded, capsys):
    """Rows 1 and 5 each get two positive timings; lm_head's weight is not timed."""
    assert kernel_bench.main(["--rows", "1,5", "--repeat", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    decoder = [m for m in tiny_loaded.model.modules() if type(m).__name__ == "Linear"]
    assert lines[0].startswith(f"{len(decoder) - 1} linear weights"), lines[0]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["1", "5"]
    assert all(float(v) > 0 for r in rows for v in r[1:]), rows


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--rows", "a"], ["--repeat", "0"]])
def test_bad_flags_are_refused(tiny_loaded, argv, capsys):
    """Row counts and repeats below 1, or not numbers, exit 2 with a message."""
    assert kernel_bench.main(argv) == 2
    assert "whole numbers" in capsys.readouterr().err
