"""The kernel micro-benchmark CLI: a row per row count, bad flags refused."""

import pytest
import torch

from engine.kernels import gemv_build
from tools import kernel_bench


def test_prints_a_row_per_row_count_without_lm_head(tiny_loaded, capsys, tmp_path, monkeypatch):
    """Rows 1 and 5 each get a positive timing per kernel, oneDNN's where torch has it, and the
    chosen kernel's last; the line under the table names the choice, measured here (a model with
    a source, a cache folder of its own); lm_head is not timed."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiny_loaded, "source", "folder/tiny-llama", raising=False)
    assert kernel_bench.main(["--rows", "1,5", "--repeat", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    decoder = [m for m in tiny_loaded.model.modules() if type(m).__name__ == "Linear"]
    assert lines[0].startswith(f"{len(decoder) - 1} linear weights"), lines[0]
    header = lines[1].split()
    expected = ["rows", "F.linear", "skinny"]
    expected += ["onednn"] if torch.backends.mkldnn.is_available() else []
    expected += ["gemv"] if gemv_build.available() else []
    assert header == [*expected, "chosen"], lines[1]
    rows = [line.split() for line in lines[2:4]]
    assert [r[0] for r in rows] == ["1", "5"]
    assert all(len(r) == len(header) and all(float(v) > 0 for v in r[1:]) for r in rows), rows
    assert lines[4].startswith("chosen: ") and "(measured at this start" in lines[4], lines[4]
    assert lines[5].startswith("the plan's kernel is within 5 % of the fastest candidate at ")
    assert " of 2 row counts (furthest: " in lines[5], lines[5]
    assert lines[6].startswith("chosen costs "), lines[6]
    dispatch = "dispatch costs " if gemv_build.available() else "dispatch: "
    assert lines[7].startswith(dispatch), lines[7]
    assert lines[8:] == [] or (
        len(lines) == 9 and lines[8].startswith("other work used ") and "% of the CPU" in lines[8]
    ), lines[8:]


def test_the_chosen_column_is_the_forced_kernel(tiny_loaded, capsys, monkeypatch):
    """CBP_ENGINE_KERNEL=skinny: the line under the table says skinny at every row count."""
    monkeypatch.setenv("CBP_ENGINE_KERNEL", "skinny")
    assert kernel_bench.main(["--rows", "2", "--repeat", "1"]) == 0
    chosen = [line for line in capsys.readouterr().out.splitlines() if line.startswith("chosen:")]
    assert len(chosen) == 1, chosen
    assert chosen[0].startswith("chosen: skinny at every row count (named by CBP_ENGINE_KERNEL)")


def test_without_onednn_the_table_keeps_its_shape(tiny_loaded, capsys, monkeypatch):
    """Without oneDNN the notice goes to stderr and the table has the two MKL columns."""
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert kernel_bench.main(["--rows", "2", "--repeat", "1"]) == 0
    captured = capsys.readouterr()
    gemv = ["gemv"] if gemv_build.available() else []
    assert captured.out.splitlines()[1].split() == ["rows", "F.linear", "skinny", *gemv, "chosen"]
    assert "no onednn column" in captured.err


@pytest.mark.skipif(not gemv_build.available(), reason="the gemv kernel is not built here")
@pytest.mark.parametrize(
    ("kernel", "expected"), [("gemv", "dispatch costs "), ("skinny", "dispatch: ")]
)
def test_the_dispatch_line_times_gemv_plans_only(
    tiny_loaded, capsys, monkeypatch, kernel, expected
):
    """A gemv plan gets the dispatch's cost at each row count; a plan without gemv says so."""
    monkeypatch.setenv("CBP_ENGINE_KERNEL", kernel)
    assert kernel_bench.main(["--rows", "1,2", "--repeat", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(x for x in lines if x.startswith("dispatch"))
    assert line.startswith(expected), line
    if kernel == "gemv":
        assert " at 1 row, " in line and " at 2 rows over gemv on the engines' own copies" in line


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--rows", "a"], ["--repeat", "0"]])
def test_bad_flags_are_refused(tiny_loaded, argv, capsys):
    """Row counts and repeats below 1, or not numbers, exit 2 with a message."""
    assert kernel_bench.main(argv) == 2
    assert "whole numbers" in capsys.readouterr().err


def test_the_near_best_line_judges_the_plans_pick_from_the_candidates_columns():
    """The plan's kernel is read from its own column (not from ``chosen``): 1.04x the fastest
    counts as near, 1.10x does not, and the furthest is named with its kernel and rows."""
    from engine.kernels.kernel_plan import RowPlan

    plan = RowPlan((1, 4), ("linear", "skinny"))
    table = [
        (1, {"F.linear": 10.4, "skinny": 10.0, "chosen": 99.0}),
        (8, {"F.linear": 20.0, "skinny": 22.0, "chosen": 22.1}),
    ]
    line = kernel_bench.near_best_line(table, plan)
    expected = "the plan's kernel is within 5 % of the fastest candidate at 1 of 2 row counts"
    assert line == f"{expected} (furthest: skinny at 8 rows, +10 %)", line


def test_bfloat16_table_times_the_half_precision_candidates(tiny_loaded, capsys, monkeypatch):
    """--dtype bfloat16 times the candidates the runner would time for bfloat16 weights here:
    always F.linear and skinny, and oneDNN's float32 copies where oneDNN is on this CPU."""
    from engine.kernels.kernel_timing import candidates_for

    monkeypatch.setenv("CBP_ENGINE_KERNEL", "linear")
    tiny_loaded.model.to(torch.bfloat16)
    monkeypatch.setattr(tiny_loaded, "dtype", torch.bfloat16)
    assert kernel_bench.main(["--rows", "2", "--repeat", "1", "--dtype", "bfloat16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "in bfloat16" in lines[0], lines[0]
    names = [kernel_bench.HEADERS.get(n, n) for n in candidates_for(torch.bfloat16)]
    assert lines[1].split() == ["rows", *names, "chosen"], lines[1]


def test_the_cost_line_sets_chosen_against_the_raw_column_of_the_kernel_it_runs():
    """``chosen`` is read against the plan's own kernel's column at each row count, not the
    fastest: +20 % over gemv at 1 row, -2 % over F.linear's ``linear`` at 8; a kernel with no
    column is left out."""
    from engine.kernels.kernel_plan import RowPlan

    plan = RowPlan((1, 4, 16), ("gemv", "linear", "onednn"))
    table = [
        (1, {"F.linear": 5.0, "gemv": 10.0, "chosen": 12.0}),
        (8, {"F.linear": 20.0, "gemv": 10.0, "chosen": 19.6}),
        (16, {"F.linear": 20.0, "chosen": 30.0}),
    ]
    line = kernel_bench.chosen_cost_line(table, plan)
    assert line == "chosen costs +20 % over gemv at 1 row, -2 % over linear at 8 rows", line
    none = kernel_bench.chosen_cost_line(table[2:], plan)
    assert none == "chosen costs: no raw column of the plan's kernels to compare with", none
