"""The engine work as one job: every engine and the verdicts on one model, answered in core types,
from a module that loads no page and no UI library (the engine process imports it)."""

from __future__ import annotations

import pickle
import subprocess
import sys

from tiny_model import make_requests, tiny_runner

from engine.config import EngineConfig
from engine.fidelity.divergence import MATCH
from engine.fidelity.reference import ReferenceCache
from engine.worker.comparison import ComparisonJob, work_in_worker

SPECS = [("hello world", 4), ("abc", 9), ("the quick brown fox", 3)]


class _Model:
    """The least a job needs of a model: a runner, its dtype, its copies, other models and
    references."""

    def __init__(self):
        self.runner = tiny_runner()
        self.dtype_name = "float32"
        self.asked_dtypes: list[str | None] = []
        self.asked_models: list[str | None] = []

    def in_model(self, name, on_stage=None):
        self.asked_models.append(name)
        return self

    def in_dtype(self, name):
        self.asked_dtypes.append(name)
        return self

    def reference_for(self, batch_invariant: bool):
        return ReferenceCache(self.runner)


def test_the_job_module_imports_no_page_and_no_ui_library():
    """Importing ``engine.worker.comparison`` loads neither gradio, plotly nor ``engine.page``."""
    code = (
        "import sys, engine.worker.comparison\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('gradio', 'plotly')"
        " or m.startswith('engine.page')]\n"
        "assert not bad, sorted(bad)[:10]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"the job module loads UI or page code: {done.stderr[-2000:]}"


def test_a_job_runs_both_engines_and_judges_them_against_the_reference():
    """A checked job gives both traces, every reference and a ✓ per engine and request, each
    engine watched to its end; the result pickles (it crosses the engine process's pipe)."""
    requests = make_requests(SPECS)
    job = ComparisonJob(requests, EngineConfig(num_slots=2), check_reference=True)
    seen = []
    result = work_in_worker(_Model(), job, lambda name, trace, **kw: seen.append((name, kw)))
    assert (result.static.engine, result.continuous.engine) == ("static", "continuous")
    assert result.hf_continuous is None and list(result.traces()) == ["static", "continuous"]
    assert sorted(result.reference) == [0, 1, 2], f"references for {sorted(result.reference)}"
    kinds = {name: {e["verdict"] for e in v.values()} for name, v in result.verdicts.items()}
    assert kinds == {"static": {MATCH}, "continuous": {MATCH}}, kinds
    assert ("static", {"done": True}) in seen and ("continuous", {"done": True}) in seen, seen
    assert ("reference", {}) in seen, "the reference pass was not watched"
    assert pickle.loads(pickle.dumps(result)).verdicts == result.verdicts


def test_the_worker_runs_a_job_in_its_precision():
    """``work_in_worker`` runs on the job's model in the job's dtype; unchecked, nothing is
    judged."""
    model = _Model()
    config = EngineConfig(num_slots=1)
    job = ComparisonJob(make_requests(SPECS[:1]), config, dtype="float32", model="org/tiny")
    result = work_in_worker(model, job, lambda *a, **k: None)
    assert model.asked_dtypes == ["float32"], model.asked_dtypes
    assert model.asked_models == ["org/tiny"], model.asked_models
    assert result.reference is None and result.verdicts is None and result.dtype == "float32"
