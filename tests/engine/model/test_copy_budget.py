"""The copy budget's greedy, as a pure function on a fixed timing table (no measurement)."""

from engine.kernels.kernel_plan import RowPlan
from engine.model.copy_budget import Pricing, keep_copies

PLAN = RowPlan((1, 17), ("gemv", "onednn"))
ROWS = (1, 64)
# ms per pass over 100 bytes of weights; gemv is not timed past 16 rows
TIMES = {
    "linear": (10.0, 100.0),
    "skinny": (8.0, 120.0),
    "gemv": (4.0, None),
    "onednn": (6.0, 60.0),
}
WEIGHTS = {"a": 100, "b": 50}
COPIES = {"a": {"gemv": 100, "onednn": 100}, "b": {"gemv": 50, "onednn": 50}}


def _budget(bound_bytes: int):
    pricing = Pricing(PLAN, ROWS, TIMES, 100)
    return keep_copies(WEIGHTS, COPIES, dict.fromkeys(COPIES, pricing), bound_bytes)


def test_every_copy_that_fits_keeps_the_plan():
    """Copies within the bound: each group keeps the plan, nothing dropped."""
    budget = _budget(300)
    assert budget.dropped == () and budget.kept_bytes == 300
    assert budget.plans == {"a": PLAN, "b": PLAN}


def test_decode_copies_go_before_prefill_copies():
    """Per token, gemv saves (8-4)/1 = 4 ms at 1 row against skinny; oneDNN saves 2 at 1 row and
    40/64 at 64, so under a bound of 150 bytes both gemv copies stay and both oneDNN go."""
    budget = _budget(150)
    assert budget.kept_bytes == 150
    dropped = {(d.group, d.kernel): (d.nbytes, d.step_ms, d.at_rows) for d in budget.dropped}
    # a's oneDNN rows would save 100 - 60 = 40 ms a pass at 64 rows; b holds half the bytes
    assert dropped == {("a", "onednn"): (100, 40.0, 64), ("b", "onednn"): (50, 20.0, 64)}
    gemv_then_linear = RowPlan((1, 17), ("gemv", "linear"))  # F.linear beats skinny at 64 rows
    assert budget.plans == {"a": gemv_then_linear, "b": gemv_then_linear}
    assert budget.cost_ms == {1: 0.0, 64: 60.0}
    assert "up to +60.0 ms a step at 64 rows" in budget.summary()


def test_a_tie_keeps_the_first_group():
    """With 250 bytes, after both gemv copies (150) one oneDNN copy fits: a's and b's save the
    same per byte, so a's (first) stays and b's goes."""
    budget = _budget(250)
    assert [(d.group, d.kernel) for d in budget.dropped] == [("b", "onednn")]
    assert budget.plans["a"] == PLAN
    assert budget.kept_bytes == 250


def test_a_bound_below_any_copy_drops_them_all():
    """A bound under the smallest copy keeps none: skinny at 1 row, F.linear at 64."""
    budget = _budget(10)
    assert budget.kept_bytes == 0 and len(budget.dropped) == 4
    assert budget.plans["a"] == RowPlan((1, 64), ("skinny", "linear"))


def test_the_head_is_priced_at_its_own_rows_only():
    """A head priced at 1 and 16 rows beside a decoder priced at 1 and 64: with no room, its
    copy's worst cost is at 16 rows, and a 64-row step pays its 16-row cost (32 ms: F.linear's
    40 against gemv's 8), the decoder group its own 64-row cost (100 - 60)."""
    head_times = {"linear": (10.0, 40.0), "skinny": (8.0, 50.0), "gemv": (4.0, 8.0)}
    head = Pricing(RowPlan.single("gemv"), (1, 16), head_times, 100)
    pricing = {"a": Pricing(PLAN, ROWS, TIMES, 100), "lm_head": head}
    copies = {"a": COPIES["a"], "lm_head": {"gemv": 100}}
    budget = keep_copies({"a": 100, "lm_head": 100}, copies, pricing, 0)
    dropped = {(d.group, d.kernel): (d.step_ms, d.at_rows) for d in budget.dropped}
    assert dropped[("lm_head", "gemv")] == (32.0, 16), dropped
    assert budget.cost_ms == {1: 8.0, 16: 36.0, 64: 72.0}, budget.cost_ms
    assert budget.plans["lm_head"] == RowPlan((1, 16), ("skinny", "linear"))


def test_a_kernel_held_within_the_tie_costs_nothing_dropped():
    """gemv's range holds 16 rows (10.4 ms, within 5 % of oneDNN's 10.0) and ends there, the
    next timed row 32: with gemv's copy dropped, oneDNN runs 16 rows faster than the full plan
    does. The cost there is 0, not -0.4 ms: a dropped copy saves no time; at 1 row it is
    oneDNN's 6 against gemv's 4."""
    rows = (1, 16, 32)
    times = {
        "linear": (10.0, 30.0, 100.0),
        "skinny": (12.0, 35.0, 120.0),
        "gemv": (4.0, 10.4, None),
        "onednn": (6.0, 10.0, 20.0),
    }
    pricing = {"a": Pricing(PLAN, rows, times, 100)}
    budget = keep_copies({"a": 100}, {"a": {"gemv": 100, "onednn": 100}}, pricing, 100)
    assert [(d.group, d.kernel, d.step_ms, d.at_rows) for d in budget.dropped] == [
        ("a", "gemv", 2.0, 1)
    ]
    assert budget.cost_ms == {1: 2.0, 16: 0.0, 32: 0.0}
    assert budget.plans["a"] == RowPlan.single("onednn")
