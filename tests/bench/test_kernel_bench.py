"""The kernel micro-benchmark CLI: a row per row count, bad flags refused."""

import pytest
import torch

from engine.bench import kernel_bench


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
    assert header == [*expected, "chosen"], lines[1]
    rows = [line.split() for line in lines[2:4]]
    assert [r[0] for r in rows] == ["1", "5"]
    assert all(len(r) == len(header) and all(float(v) > 0 for v in r[1:]) for r in rows), rows
    assert lines[4].startswith("chosen: ") and "(measured at this start" in lines[4], lines[4]
    assert lines[5:] == [] or (
        len(lines) == 6 and lines[5].startswith("other work used ") and "% of the CPU" in lines[5]
    ), lines[5:]


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
    assert captured.out.splitlines()[1].split() == ["rows", "F.linear", "skinny", "chosen"]
    assert "no onednn column" in captured.err


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--rows", "a"], ["--repeat", "0"]])
def test_bad_flags_are_refused(tiny_loaded, argv, capsys):
    """Row counts and repeats below 1, or not numbers, exit 2 with a message."""
    assert kernel_bench.main(argv) == 2
    assert "whole numbers" in capsys.readouterr().err
