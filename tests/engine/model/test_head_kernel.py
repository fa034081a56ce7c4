"""The LM head's own kernel: timed apart at the rows it meets (one per sequence), kept per host
beside the decoder's choice, priced by the copy budget at those rows only, and counted once
where it is tied to the input embedding."""

import json

import pytest
import torch
from tiny_model import VOCAB, runner_of, tiny_model, tiny_runner

from engine.kernels import gemv_build, kernel_timing
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import HEAD_ROWS, Timings
from engine.model import kernel_store
from engine.model.memory_account import memory_account

HAS_ONEDNN = torch.backends.mkldnn.is_available()
HEAD_KERNEL = "gemv" if gemv_build.available() else "linear"  # the head's fastest, faked
PACKED = "onednn" if HAS_ONEDNN else "gemv" if gemv_build.available() else None


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test keeps its choices in its own folder, with the default kernel settings."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CBP_ENGINE_KERNEL", raising=False)
    monkeypatch.delenv("CBP_WEIGHT_COPIES_MAX", raising=False)
    return tmp_path


def _is_head(linears) -> bool:
    return len(linears) == 1 and linears[0].out_features == VOCAB


@pytest.fixture()
def timed(monkeypatch) -> list:
    """Timings (not measured): the head's fastest is ``HEAD_KERNEL``, the decoder's ``skinny``;
    each call appends ``("lm_head" | "decoder", rows)``."""
    calls = []

    def fake(linears, names, rows=kernel_timing.ROW_COUNTS, total_linears=None, **kwargs):
        part = "lm_head" if _is_head(linears) else "decoder"
        calls.append((part, tuple(rows)))
        best = HEAD_KERNEL if part == "lm_head" else "skinny"
        times = {n: tuple(1.0 if n == best else 2.0 for _ in rows) for n in names}
        return Timings(tuple(rows), times, len(linears), total_linears, 1, 0.01, 3)

    monkeypatch.setattr(kernel_timing, "time_candidates", fake)
    return calls


def _runner(model=None):
    runner = tiny_runner() if model is None else runner_of(model, "tiny-tied")
    runner.loaded.source = "folder/tiny"
    return runner


def test_the_lm_head_is_timed_apart_at_its_own_rows_and_runs_its_own_plan(cache_dir, timed):
    """The head is timed alone at 1..16 rows and runs its own fastest kernel, the decoder
    linears theirs; both choices are kept, apart, and read back by the next start."""
    runner = _runner()
    head = runner.model.get_output_embeddings()
    planned = runner.engine_kernel.modules.planned
    assert planned[head].plan == RowPlan.single(HEAD_KERNEL), planned[head].plan
    decoder = [p.plan for m, p in planned.items() if m is not head]
    assert decoder and all(p == RowPlan.single("skinny") for p in decoder), decoder
    assert timed == [("decoder", kernel_timing.ROW_COUNTS), ("lm_head", HEAD_ROWS)], timed
    assert max(HEAD_ROWS) == 16
    files = sorted((cache_dir / kernel_store.FOLDER).glob("*.json"))
    parts = sorted(json.loads(f.read_text())["key"]["part"] for f in files)
    assert parts == ["decoder", "lm_head"], parts
    summary = runner.kernel_summary()
    assert f"lm_head: {HEAD_KERNEL} 1-16 rows (timed apart, measured at this start" in summary
    again = _runner()
    assert again.engine_kernel.modules.planned[again.model.get_output_embeddings()].plan == (
        RowPlan.single(HEAD_KERNEL)
    )
    assert len(timed) == 2, "the next start timed again instead of reading the kept choices"
    assert "(timed apart, measured at an earlier start" in again.kernel_summary()


def test_a_head_timing_past_its_budget_finishes_its_first_round_and_is_kept(cache_dir, monkeypatch):
    """The head is one weight, so no smaller sample exists: a budget spent before its first pass
    (a 262 k-row head's first round takes about 5 s) still times every candidate at every row
    once, and the choice is kept for the next start, not measured again at each."""
    real = kernel_timing.time_candidates

    def head_starved(linears, names, rows=kernel_timing.ROW_COUNTS, **kwargs):
        budget = 0.0 if _is_head(linears) else 120.0
        return real(linears, names, rows, **{**kwargs, "budget_s": budget})

    monkeypatch.setattr(kernel_timing, "time_candidates", head_starved)
    monkeypatch.setattr(kernel_timing, "QUIET_SHARE", 1.0)
    runner = _runner()
    choice = runner.head_choice
    assert choice.origin == "measured" and choice.timings.complete, choice
    assert all(t is not None for ts in choice.timings.times_ms.values() for t in ts), choice
    assert choice.path is not None, "the head's complete timing was not kept"
    assert "timing finished no pass" not in runner.kernel_summary()


def test_a_decoder_timing_that_falls_back_leaves_the_head_untimed_and_says_so(monkeypatch):
    """The decoder's timing timed nothing (a busy host): every linear runs F.linear, so the head
    is not timed (its budget would add seconds to the start for nothing), and its line says
    why."""
    real, parts = kernel_timing.time_candidates, []

    def decoder_starved(linears, names, rows=kernel_timing.ROW_COUNTS, **kwargs):
        parts.append("lm_head" if _is_head(linears) else "decoder")
        budget = 120.0 if _is_head(linears) else 0.0
        return real(linears, names, rows, **{**kwargs, "budget_s": budget})

    monkeypatch.setattr(kernel_timing, "time_candidates", decoder_starved)
    runner = _runner()
    assert runner.kernel_choice.origin == "fallback"
    summary = runner.kernel_summary()
    assert parts == ["decoder"], parts
    assert runner.head_choice is runner.kernel_choice
    assert (
        "lm_head: linear 1-16 rows (not timed apart: the decoder's timing fell back to F.linear)"
        in summary
    ), summary


@pytest.mark.skipif(PACKED is None, reason="no packed kernel builds here")
def test_the_copy_budget_prices_the_head_only_at_its_own_rows(monkeypatch):
    """With no room for copies, every copy is dropped; the head's is priced at its worst row
    count among 1..16 (the rows it meets), never at a prefill's 512, and its share of a 512-row
    step's cost is its 16-row cost."""
    monkeypatch.setenv("CBP_WEIGHT_COPIES_MAX", "0")

    def fake(linears, names, rows=kernel_timing.ROW_COUNTS, total_linears=None, **kwargs):
        times = {n: tuple((1.0 if n == PACKED else 3.0) * r for r in rows) for n in names}
        nbytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        return Timings(tuple(rows), times, len(linears), total_linears, nbytes, 0.01, 3)

    monkeypatch.setattr(kernel_timing, "time_candidates", fake)
    runner = _runner()
    budget = runner.copy_budget
    head = [d for d in budget.dropped if d.group == "lm_head"]
    assert [d.kernel for d in head] == [PACKED], budget.dropped
    assert head[0].at_rows == 16, f"the head's copy priced at {head[0].at_rows} rows"
    # the head's 1 pass over its own bytes: (3 - 1) ms a row at 16 rows
    assert head[0].step_ms == pytest.approx(2.0 * 16), head[0]
    decoder = [d for d in budget.dropped if d.group != "lm_head"]
    assert decoder and all(d.at_rows == 512 for d in decoder), decoder
    assert runner.engine_kernel.modules.planned[runner.model.get_output_embeddings()].plan == (
        RowPlan.single("linear")
    )


@pytest.mark.skipif(PACKED is None, reason="no packed kernel builds here")
def test_a_tied_head_counts_its_weight_once_and_its_copy_once(monkeypatch, timed):
    """SmolLM2 ties lm_head to embed_tokens: the weights count the shared matrix once, the bound
    is a multiple of that, and the head's packed copy is counted once among the copies."""
    model = tiny_model()
    model.config.tie_word_embeddings = True
    model.tie_weights()
    head = model.get_output_embeddings()
    assert head.weight is model.get_input_embeddings().weight
    monkeypatch.setenv("CBP_WEIGHT_COPIES_MAX", "1")
    runner = _runner(model)
    runner.__dict__["head_choice"] = kernel_store.KernelChoice(
        RowPlan.single(PACKED), "measured", runner.kernel_choice.timings
    )
    runner.engine_kernel  # noqa: B018  (the copies made, as a run makes them)
    account = memory_account(runner)
    unique = sum(
        p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values()
    )
    every = sum(
        p.numel() * p.element_size() for _, p in model.named_parameters(remove_duplicate=False)
    )
    assert every - unique == head.weight.numel() * 4, "the test model's head is not tied"
    assert account["weights_bytes"] == unique, account["weights_bytes"]
    assert runner.copy_budget.bound_bytes == unique
    head_copy = runner.engine_kernel.modules.planned[head].bytes_by_kernel()
    assert set(head_copy) == {PACKED}
    assert head_copy[PACKED] >= head.weight.numel() * 4
    assert account["packed_bytes"] == {PACKED: head_copy[PACKED]}, "the head's copy miscounted"
