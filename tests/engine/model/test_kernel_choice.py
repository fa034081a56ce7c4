"""The runner's kernel choice: measured once per host, kept on disk, read back, or forced."""

import json
import logging

import pytest
import torch
from tiny_model import tiny_runner
from torch import nn

from engine.kernels import kernel_plan, kernel_timing
from engine.kernels.gemv_build import on_x86
from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import Timings
from engine.model import kernel_choice, kernel_store


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test keeps its choices in its own folder, never the user's, with the default kernel
    setting."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CBP_ENGINE_KERNEL", raising=False)
    return tmp_path


@pytest.fixture()
def measured(monkeypatch) -> list:
    """Fake timings (skinny fastest at every row count, every round run): each measurement
    appends its candidates here."""
    calls = []

    def fake(linears, names, rows=kernel_timing.ROW_COUNTS, total_linears=None, **kwargs):
        calls.append(names)
        times = {n: tuple(1.0 if n == "skinny" else 2.0 for _ in rows) for n in names}
        return Timings(tuple(rows), times, len(linears), total_linears, 1, 0.01, 3)

    monkeypatch.setattr(kernel_timing, "time_candidates", fake)
    return calls


def _runner(source: str | None = "folder/tiny-llama"):
    """A tiny runner whose model came from ``source`` (None: built in memory)."""
    runner = tiny_runner()
    if source is not None:
        runner.loaded.source = source
    return runner


def _files(cache_dir):
    return sorted((cache_dir / kernel_store.FOLDER).glob("*.json"))


def test_the_choice_is_measured_once_then_read_back(cache_dir, monkeypatch):
    """The first runner times the kernels (really) and keeps the choice in one file; a second
    runner reads that file and times nothing, and gets the same plan."""
    calls = []
    real = kernel_timing.time_candidates

    def counted(*args, **kwargs):
        calls.append(1)  # a generous budget: a busy test machine must not cut the timing short
        return real(*args, **{**kwargs, "budget_s": 120.0})

    monkeypatch.setattr(kernel_timing, "time_candidates", counted)
    monkeypatch.setattr(kernel_timing, "QUIET_SHARE", 1.0)  # nor must other work stop the keeping
    first = _runner().kernel_choice
    assert (first.origin, len(calls)) == ("measured", 1)
    assert [str(p) for p in _files(cache_dir)] == [first.path], "one file, named in the choice"
    second = _runner().kernel_choice
    assert (second.origin, len(calls)) == ("cached", 1), "the second runner measured again"
    assert second.plan == first.plan and second.timings == first.timings


def test_a_forced_kernel_wins_over_the_cache(cache_dir, measured, monkeypatch):
    """With a choice kept (skinny), CBP_ENGINE_KERNEL=linear still gives linear, unmeasured."""
    assert _runner().engine_kernel_name == "skinny"
    timed = len(measured)  # the decoder's and the LM head's
    monkeypatch.setenv("CBP_ENGINE_KERNEL", "linear")
    runner = _runner()
    assert (runner.kernel_choice.origin, runner.engine_kernel_name) == ("forced", "linear")
    assert len(measured) == timed, "a forced kernel needs no measurement"
    assert "named by CBP_ENGINE_KERNEL" in runner.kernel_summary()


def test_measure_times_again_and_replaces_the_file(cache_dir, measured, monkeypatch):
    """CBP_ENGINE_KERNEL=measure ignores the kept choice, measures, and rewrites the file."""
    assert _runner().kernel_choice.origin == "measured"
    monkeypatch.setenv("CBP_ENGINE_KERNEL", "measure")
    assert _runner().kernel_choice.origin == "measured"
    assert len(measured) == 2 and len(_files(cache_dir)) == 1


@pytest.mark.parametrize(
    "damage",
    ["{not json", '{"key": {}, "choice": {}}', "[1, 2]", "bad plan"],
    ids=["not-json", "another-key", "not-a-dict", "bad-plan"],
)
def test_a_corrupt_file_is_measured_again_with_a_warning(cache_dir, measured, caplog, damage):
    """A kept file that is not JSON, not a choice, or holds another key: a warning names it, the
    kernels are timed again, and a good file replaces it."""
    path = _runner().kernel_choice.path
    if damage == "bad plan":
        doc = json.loads(open(path).read())
        doc["choice"]["plan"] = [{"kernel": "linear", "from_rows": 3, "to_rows": None}]
        damage = json.dumps(doc)
    with open(path, "w") as handle:
        handle.write(damage)
    with caplog.at_level(logging.WARNING, logger=kernel_store.__name__):
        again = _runner().kernel_choice
    assert "is corrupt" in caplog.text and path in caplog.text, caplog.text
    assert again.origin == "measured" and len(measured) == 2
    assert _runner().kernel_choice.origin == "cached", "the file was not rewritten"


def test_the_key_changes_with_dtype_model_and_torch_version(monkeypatch):
    """Each of dtype, model name, model source and torch's version gives another file."""
    linears = [nn.Linear(8, 4), nn.Linear(4, 8)]
    base = ("m", "src", torch.float32, linears, ("linear",))
    path = kernel_store.choice_path(kernel_store.host_key(*base))
    variants = [
        ("m", "src", torch.bfloat16, linears, ("linear",)),
        ("other", "src", torch.float32, linears, ("linear",)),
        ("m", "elsewhere", torch.float32, linears, ("linear",)),
        ("m", "src", torch.float32, linears, ("linear", "skinny")),
    ]
    paths = {kernel_store.choice_path(kernel_store.host_key(*v)) for v in variants}
    assert path not in paths and len(paths) == len(variants)
    key = kernel_store.host_key(*base)
    assert key["cpu"] and key["cpu_flags"] and key["torch"] == torch.__version__
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert kernel_store.choice_path(kernel_store.host_key(*base)) != path


def test_a_model_built_in_memory_is_not_timed(cache_dir, measured):
    """No source, nothing timed or written: oneDNN on x86 (skinny elsewhere), as said."""
    runner = _runner(source=None)
    choice = runner.kernel_choice
    assert (choice.origin, choice.path, choice.timings) == ("default", None, None)
    assert runner.engine_kernel_name == ("onednn" if on_x86() else "skinny")
    assert "not measured: a model built in memory" in runner.kernel_summary()
    assert not measured and not _files(cache_dir)


def test_a_measurement_cut_short_is_not_kept(cache_dir, monkeypatch, caplog):
    """A measurement the budget stopped before one full round is used but not written."""

    def short(linears, names, rows=kernel_timing.ROW_COUNTS, total_linears=None, **kwargs):
        times = {n: (1.0,) + (None,) * (len(rows) - 1) for n in names}
        return Timings(tuple(rows), times, len(linears), total_linears, 1, 5.0, 0)

    monkeypatch.setattr(kernel_timing, "time_candidates", short)
    with caplog.at_level(logging.WARNING, logger=kernel_store.__name__):
        choice = _runner().kernel_choice
    assert choice.origin == "measured" and choice.path is None and not _files(cache_dir)
    assert "cut short" in caplog.text


def test_a_timing_that_times_nothing_falls_back_to_f_linear(cache_dir, monkeypatch, caplog):
    """A zero time budget times no kernel: the runner starts on plain F.linear (no copies), says
    so in the log and its summary, keeps nothing, and its logits are the model's own."""
    real = kernel_timing.time_candidates

    def no_budget(*args, **kwargs):
        return real(*args, **{**kwargs, "budget_s": 0.0})

    monkeypatch.setattr(kernel_timing, "time_candidates", no_budget)
    monkeypatch.setattr(kernel_timing, "candidates_for", lambda dtype: ("linear", "skinny"))
    with caplog.at_level(logging.WARNING, logger=kernel_store.__name__):
        runner = _runner()
        choice = runner.kernel_choice
    assert (choice.origin, choice.plan) == ("fallback", RowPlan.single("linear")), choice
    assert choice.timings.rounds == 0 and choice.path is None and not _files(cache_dir)
    assert runner.engine_kernel is kernel_plan.PLAIN_KERNEL, runner.engine_kernel_name
    assert "plain F.linear" in caplog.text, caplog.text
    summary = runner.kernel_summary()
    assert summary.startswith("matmul: linear at every row count (timing finished no"), summary
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.inference_mode():
        plain = runner.model(ids).logits
        with runner.engine_kernels():
            routed = runner.model(ids).logits
    assert torch.equal(plain, routed), "the fallback's logits differ from the model's own"


def test_a_measurement_taken_while_the_cpu_was_busy_is_not_kept(cache_dir, monkeypatch, caplog):
    """Other work over the quiet share: used, not written, and the summary says why."""

    def busy(linears, names, rows=kernel_timing.ROW_COUNTS, total_linears=None, **kwargs):
        times = {n: tuple(1.0 if n == "skinny" else 2.0 for _ in rows) for n in names}
        return Timings(tuple(rows), times, len(linears), total_linears, 1, 5.0, 3, 0.45)

    monkeypatch.setattr(kernel_timing, "time_candidates", busy)
    with caplog.at_level(logging.WARNING, logger=kernel_store.__name__):
        runner = _runner()
    choice = runner.kernel_choice
    assert choice.origin == "measured" and choice.path is None, "a busy measurement was kept"
    assert not _files(cache_dir), "a file was written for a busy measurement"
    assert "45% of the CPU" in caplog.text and "45% of the CPU" in runner.kernel_summary()


def test_an_unwritable_cache_costs_only_a_warning(cache_dir, measured, caplog):
    """Where the folder cannot be made, the choice is still measured and used."""
    (cache_dir / kernel_store.FOLDER).write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger=kernel_store.__name__):
        runner = _runner()
        assert runner.engine_kernel_name == "skinny" and runner.kernel_choice.path is None
    assert "Could not keep the kernel choice" in caplog.text


def test_the_summary_names_the_ranges_and_how_they_were_chosen(measured):
    """kernel_summary: the plan's ranges, measured or read from an earlier start, the copies."""
    runner = _runner()
    runner.__dict__["kernel_choice"] = kernel_store.KernelChoice(
        RowPlan((1, 5), ("linear", "skinny")), "cached"
    )
    summary = runner.kernel_summary()
    assert summary.startswith("matmul: linear 1-4 rows, skinny 5+ rows"), summary
    assert "earlier start" in summary and "+0 MB" in summary, summary
    assert "measured at this start" in _runner().kernel_summary()


@pytest.mark.parametrize("old_value", ["auto", "on", "off", ""])
def test_a_host_s_old_compiled_step_setting_starts_eager(monkeypatch, caplog, old_value):
    """CBP_COMPILED_STEP is retired: any value starts a runner (no ValueError), a value other
    than off or empty says in the log that it is ignored, and the step summary says eager."""
    monkeypatch.setenv("CBP_COMPILED_STEP", old_value)
    with caplog.at_level(logging.WARNING, logger="engine.model.kernel_choice"):
        runner = _runner()
    ignored = f"CBP_COMPILED_STEP={old_value} is ignored" in caplog.text
    assert ignored == (old_value in ("auto", "on")), caplog.text
    assert runner.step_summary() == "step: eager, the fused layers", runner.step_summary()
    monkeypatch.setenv("CBP_FUSED_LAYERS", "off")
    assert runner.step_summary() == "step: eager, the fused layers"  # read once, at start
    assert _runner().step_summary() == "step: eager, the model's own layers (CBP_FUSED_LAYERS=off)"


@pytest.mark.parametrize("text", ["lots", "-1", "nan"])
def test_a_bad_copy_bound_is_refused_naming_the_variable(monkeypatch, text):
    """CBP_WEIGHT_COPIES_MAX that is not a number >= 0 stops the runner with a message."""
    monkeypatch.setenv("CBP_WEIGHT_COPIES_MAX", text)
    with pytest.raises(ValueError, match="CBP_WEIGHT_COPIES_MAX"):
        tiny_runner()


@pytest.mark.parametrize(("text", "bound"), [("inf", float("inf")), ("0", 0.0), ("2.5", 2.5)])
def test_the_copy_bound_reads_any_number_from_zero_to_infinity(monkeypatch, text, bound):
    """CBP_WEIGHT_COPIES_MAX=inf keeps every copy, as it always could."""
    monkeypatch.setenv("CBP_WEIGHT_COPIES_MAX", text)
    assert kernel_choice.read_copies_max() == bound
