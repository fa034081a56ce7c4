"""The kernel plan: one kernel per range of row counts, dispatched per call; the host's setting."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import kernel_plan, linear_kernel
from engine.kernels.kernel_plan import RowPlan
from engine.settings import choice as read_choice

PLAN = RowPlan((1, 5, 64), ("linear", "skinny", "linear"))


@pytest.mark.parametrize(
    ("num_rows", "name"),
    [(0, "linear"), (1, "linear"), (4, "linear"), (5, "skinny"), (63, "skinny"), (64, "linear")],
)
def test_each_row_count_falls_in_its_range(num_rows, name):
    """name_at: a range runs from its start to the row before the next start; the last has no
    end, and 0 rows take the first range."""
    assert PLAN.name_at(num_rows) == name
    assert PLAN.name_at(10_000) == "linear"


def test_a_plan_says_its_ranges_for_people():
    """describe() and label name each range in row order; a one-kernel plan says so."""
    assert PLAN.describe() == "linear 1-4 rows, skinny 5-63 rows, linear 64+ rows"
    assert PLAN.label == "linear+skinny+linear" and PLAN.kernels == ("linear", "skinny")
    assert RowPlan.single("onednn").describe() == "onednn at every row count"


def test_a_plan_says_its_ranges_up_to_a_row_count():
    """describe(up_to=M) names the ranges within 1 .. M rows, the last one cut at M."""
    assert PLAN.describe(up_to=16) == "linear 1-4 rows, skinny 5-16 rows"
    assert PLAN.describe(up_to=4) == "linear 1-4 rows"
    assert RowPlan.single("gemv").describe(up_to=16) == "gemv 1-16 rows"


@pytest.mark.parametrize(
    ("starts", "names"),
    [((2,), ("linear",)), ((1, 1), ("a", "b")), ((1, 8, 4), ("a", "b", "c")), ((1,), ()), ((), ())],
)
def test_a_malformed_plan_is_refused(starts, names):
    """Starts must ascend from 1, one name each: anything else is a ValueError."""
    with pytest.raises(ValueError, match="ascending from 1"):
        RowPlan(starts, names)


def test_the_kernel_sends_each_call_to_its_ranges_kernel(monkeypatch):
    """kernel_for: a call with M rows (2-D or 3-D input) goes to the plan's kernel at M."""
    calls = []

    def spy(x, weight, bias=None):
        calls.append(x.numel() // x.shape[-1])
        return F.linear(x, weight, bias)

    monkeypatch.setattr(linear_kernel, "skinny_linear", spy)
    layer = nn.Linear(8, 4)
    kernel = kernel_plan.kernel_for([layer], PLAN)
    for shape in [(1, 8), (3, 8), (1, 5, 8), (63, 8), (64, 8), (200, 8)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(kernel.forward(layer, x), layer(x))
    assert calls == [5, 63], f"skinny ran at {calls} rows; the plan gives it 5 to 63"
    assert kernel.name == "linear+skinny+linear" and kernel.extra_bytes == 0


@pytest.mark.parametrize("value", ["auto", " Skinny ", "", "measure", "linear", "onednn"])
def test_old_and_new_kernel_settings_are_read(monkeypatch, value):
    """CBP_ENGINE_KERNEL keeps its old values (auto, skinny; empty is auto) and names kernels."""
    monkeypatch.setenv("CBP_ENGINE_KERNEL", value)
    setting = read_choice("CBP_ENGINE_KERNEL", kernel_plan.KERNEL_CHOICES)
    assert setting == (value.strip().lower() or "auto")


def test_every_named_kernel_is_a_candidate():
    """Each CBP_ENGINE_KERNEL choice but auto and measure is a kernel best_kernel can build."""
    named = set(kernel_plan.KERNEL_CHOICES) - {"auto", "measure"}
    assert named == set(linear_kernel.CANDIDATES)
    layer = nn.Linear(8, 4)
    for name in sorted(named):
        kernel = kernel_plan.best_kernel([layer], name)
        x = torch.randn(2, 8)
        torch.testing.assert_close(kernel.forward(layer, x), layer(x))
