"""Kernel timing: the fastest candidate per row range, a bounded measurement, the candidates."""

import itertools

import pytest
import torch
from torch import nn

from engine.kernels import kernel_timing
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import choose_plan, time_candidates
from engine.model.kernel_store import KernelChoice

ROWS = (1, 2, 4, 8, 64)


def test_each_range_gets_the_candidate_with_the_least_time():
    """Fake timings: linear wins at 1-2 rows, onednn at 4-8, skinny from 64 (a clear margin)."""
    times = {
        "linear": (10.0, 11.0, 30.0, 40.0, 90.0),
        "onednn": (20.0, 20.0, 12.0, 14.0, 80.0),
        "skinny": (15.0, 16.0, 25.0, 35.0, 50.0),
    }
    plan = choose_plan(ROWS, times)
    assert plan == RowPlan((1, 4, 64), ("linear", "onednn", "skinny")), plan
    for i, num_rows in enumerate(ROWS):
        least = min(times, key=lambda n, i=i: times[n][i])
        assert plan.name_at(num_rows) == least, f"{num_rows} rows: {plan.name_at(num_rows)}"


def test_rows_between_measured_counts_take_the_choice_below():
    """5 to 7 rows were not measured: they take 4 rows' choice; 1000 rows take 64's."""
    times = {"linear": (1.0, 1.0, 9.0, 1.0, 9.0), "onednn": (5.0, 5.0, 1.0, 5.0, 1.0)}
    plan = choose_plan(ROWS, times)
    assert [plan.name_at(m) for m in (5, 7, 8, 1000)] == ["onednn", "onednn", "linear", "onednn"]


def test_a_near_tie_keeps_the_kernel_chosen_below():
    """Within 5 % of the least, the kernel already running keeps the range; past it, it loses."""
    near = {"linear": (10.0, 10.4), "onednn": (11.0, 10.0)}
    assert choose_plan((1, 2), near) == RowPlan.single("linear")
    far = {"linear": (10.0, 10.6), "onednn": (11.0, 10.0)}
    assert choose_plan((1, 2), far) == RowPlan((1, 2), ("linear", "onednn"))


def test_a_kernel_with_a_row_limit_hands_over_just_past_it():
    """gemv, timed up to 16 rows (F.linear under its name above), fastest at 16: the next kernel
    takes over at 17 rows, not at the next measured count (32)."""
    limit = kernel_timing.MAX_ROWS["gemv"]
    times = {"gemv": (1.0, 2.0, None), "onednn": (3.0, 4.0, 5.0)}
    plan = choose_plan((1, limit, 32), times)
    assert plan == RowPlan((1, limit + 1), ("gemv", "onednn")), plan


def test_unmeasured_cells_are_skipped_and_nothing_timed_is_an_error():
    """None (a pass the budget cut) is no time; with no time at all there is no plan."""
    times = {"linear": (3.0, None, None), "skinny": (1.0, None, None)}
    assert choose_plan((1, 2, 3), times) == RowPlan.single("skinny")
    plan = choose_plan((1, 8), {"linear": (None, 2.0), "skinny": (None, 3.0)})
    assert plan == RowPlan.single("linear"), "the first measured count's choice starts at 1 row"
    with pytest.raises(ValueError, match="no kernel was timed"):
        choose_plan((1,), {"linear": (None,)})


def _linears(count: int = 4) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [nn.Linear(16, 24) for _ in range(count)]


def test_every_candidate_is_timed_at_every_row_count():
    """With time to spare, each candidate gets a positive best time at each row count."""
    names = ("linear", "skinny")
    timings = time_candidates(_linears(), names, rows=(1, 3, 9), repeat=2)
    assert set(timings.times_ms) == set(names)
    assert all(t is not None and t > 0 for ts in timings.times_ms.values() for t in ts), timings
    assert timings.rounds == 2 and timings.complete
    assert timings.timed_linears == timings.total_linears == 4
    assert timings.timed_bytes == 4 * 24 * 16 * 4


def test_the_measurement_stops_at_its_budget():
    """A clock that moves 1 s per reading, so each pass takes 1 s and the 5 s budget holds two:
    the third would end past it (its guess: its kernel's last pass), so the measurement stops,
    the rest have no time, and it is not complete."""
    ticks = itertools.count()
    timings = time_candidates(
        _linears(), ("linear", "skinny"), rows=(1, 2, 4), clock=lambda: float(next(ticks))
    )
    want = {"linear": (1000.0, None, None), "skinny": (1000.0, None, None)}
    assert timings.times_ms == want, timings.times_ms
    assert timings.rounds == 0 and not timings.complete


def test_a_whole_round_is_finished_past_the_budget_and_no_more():
    """``whole_round``: with the clock of the test above (1 s a pass, a 5 s budget), every
    candidate is timed at every row count once (6 passes, past the budget), then it stops."""
    ticks = itertools.count()
    timings = time_candidates(
        _linears(), ("linear", "skinny"), rows=(1, 2, 4), clock=lambda: float(next(ticks)),
        whole_round=True,
    )  # fmt: skip
    assert all(t == 1000.0 for ts in timings.times_ms.values() for t in ts), timings.times_ms
    assert timings.rounds == 1 and timings.complete


def test_the_sample_is_whole_layers_past_twice_the_cache(monkeypatch):
    """sample_linears: whole layers (one period of the shapes) until the target bytes; a model
    smaller than the target whole."""
    torch.manual_seed(0)
    layer = [(16, 24), (16, 8), (24, 16)]  # (in, out): 1536, 512 and 1536 bytes
    linears = [nn.Linear(k, n) for _ in range(4) for k, n in layer]
    assert len(kernel_timing.sample_linears(linears, target_bytes=4000)) == 6, "2 whole layers"
    assert len(kernel_timing.sample_linears(linears, target_bytes=3584)) == 3, "exactly 1 layer"
    odd = _linears(3) + [nn.Linear(8, 8)]  # no period: the prefix stops at the target
    assert len(kernel_timing.sample_linears(odd, target_bytes=2000)) == 2
    monkeypatch.setattr(kernel_timing, "last_level_cache_bytes", lambda: 2**30)
    assert len(kernel_timing.sample_linears(linears)) == 12


def test_half_precision_times_onednn_only_on_a_cpu_built_for_it(monkeypatch):
    """bfloat16: oneDNN's own kernel is a candidate only with AVX512-BF16 or AMX; float32 copies
    and the plain kernels always are (on x86 with oneDNN); gemv last, where it is built."""
    monkeypatch.setattr(kernel_timing.gemv_build, "available", lambda: False)
    monkeypatch.setattr(kernel_timing, "on_x86", lambda: True)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(kernel_timing, "cpu_capabilities", lambda: {"avx512_bf16": False})
    assert kernel_timing.candidates_for(torch.bfloat16) == ("linear", "skinny", "onednn_f32")
    monkeypatch.setattr(kernel_timing, "cpu_capabilities", lambda: {"amx_bf16": True})
    assert "onednn" in kernel_timing.candidates_for(torch.bfloat16)
    assert kernel_timing.candidates_for(torch.float32) == ("linear", "skinny", "onednn")
    monkeypatch.setattr(kernel_timing, "on_x86", lambda: False)
    assert kernel_timing.candidates_for(torch.float32) == ("linear", "skinny")
    monkeypatch.setattr(kernel_timing.gemv_build, "available", lambda: True)
    assert kernel_timing.candidates_for(torch.bfloat16) == ("linear", "skinny", "gemv")
    assert "gemv" not in kernel_timing.candidates_for(torch.float16)  # not a dtype it takes


def test_a_choice_survives_its_json():
    """as_dict then from_dict gives the same plan and timings; an unknown kernel is refused."""
    timings = time_candidates(_linears(2), ("linear", "skinny"), rows=(1, 2), repeat=1)
    choice = KernelChoice(choose_plan(timings.rows, timings.times_ms), "measured", timings)
    again = KernelChoice.from_dict(choice.as_dict(), "cached", "/x.json")
    assert (again.plan, again.timings, again.origin, again.path) == (
        choice.plan,
        timings,
        "cached",
        "/x.json",
    )
    doc = choice.as_dict()
    doc["plan"][0]["kernel"] = "fast"
    with pytest.raises(ValueError, match="unknown kernels"):
        KernelChoice.from_dict(doc, "cached")
