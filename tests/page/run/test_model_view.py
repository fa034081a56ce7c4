"""The engine process's model as the page sees it: no weights in the page's process, and the same
tokens, checks and labels as the model in-process; another precision is asked of the engine
process.

One worker for the module, on ``tiny_worker_model``'s model (spawn and a tiny model load cost
seconds).
"""

from __future__ import annotations

import gc
import types

import pytest
import torch
from tiny_model import tiny_process_worker, tiny_shared

from engine.model.loader import ModelLoadError
from engine.page.run import shared_model
from engine.page.run.run_options import RunOptions, prepare
from engine.page.run.shared_model import PageModel

ROWS = [["hello world", 4], ["abc", 30], ["the quick brown fox", 3]]
OPTIONS = RunOptions(chat_template=True, kv_mode="paged", kv_budget_mib=1.0)


@pytest.fixture(scope="module")
def process():
    """One engine process on the tiny model for the module; ended afterwards."""
    yield from tiny_process_worker("tiny")


@pytest.fixture(scope="module")
def view(process) -> PageModel:
    """The page's model, made from the engine process's facts and pace."""
    model = PageModel.connect(process)
    return model


def weights_reachable(root) -> list[str]:
    """Every torch module with parameters and every tensor reachable from ``root`` through
    objects, containers and closures (not through modules, classes or a function's globals,
    which reach the whole program)."""
    found, seen, todo = [], set(), [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, types.ModuleType | type):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module) and any(True for _ in obj.parameters()):
            found.append(type(obj).__name__)
            continue
        if isinstance(obj, torch.Tensor):
            found.append(f"tensor {tuple(obj.shape)}")
            continue
        if isinstance(obj, types.FunctionType):
            cells = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
            todo.extend([*cells, *(obj.__defaults__ or ())])
            continue
        todo.extend(gc.get_referents(obj))
    return found


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def test_the_page_holds_no_weights_beside_an_engine_process(view, monkeypatch):
    """From the page's shared model, once it is the engine process's view, no torch module with
    parameters and no tensor can be reached; from the model in-process, the weights can (the
    walk finds what it looks for)."""
    monkeypatch.setattr(shared_model, "_shared_model", None)
    shared_model.use_model(view)
    assert shared_model.get_model() is view
    found = weights_reachable(shared_model.get_model())
    assert not found, f"the page's process holds model weights: {found[:5]}"
    assert "LlamaForCausalLM" in weights_reachable(tiny_shared()), "the walk missed the weights"


def test_the_view_tokenizes_checks_and_labels_as_the_model_in_process(view):
    """The view's requests, config, label and KV-budget refusal are the in-process model's."""
    here = tiny_shared()
    assert prepare(view, ROWS, 2, OPTIONS) == prepare(here, ROWS, 2, OPTIONS)
    assert view.label == here.label and view.dtype_choices() == here.dtype_choices()
    # the peak RSS ends the line: each process's own, the rest the same
    lines = [m.label_markdown.rsplit(" · ", 1) for m in (view, here)]
    assert lines[0][0] == lines[1][0], "the view's model line is not its model's"
    assert all('">peak RSS ' in memory for _, memory in lines), lines
    too_small = RunOptions(kv_mode="paged", kv_budget_mib=0.001)
    with pytest.raises(ValueError) as theirs:
        prepare(view, ROWS, 2, too_small)
    with pytest.raises(ValueError) as ours:
        prepare(here, ROWS, 2, too_small)
    assert str(theirs.value) == str(ours.value), "the KV budget is refused in other words"
    view.check_batch_invariant()  # the tiny Llama runs in batch-invariant mode


def test_another_precision_is_asked_of_the_engine_process(view):
    """bfloat16 comes from the engine process's facts, once, sharing the lock and the queue;
    float16 is refused on a CPU before anything is asked."""
    variant = view.in_dtype("bfloat16")
    assert variant.dtype_name == "bfloat16" and variant.facts.card.dtype == torch.bfloat16
    assert view.in_dtype("bfloat16") is variant, "asked again"
    assert variant.lock is view.lock and variant.queue is view.queue
    assert view.in_dtype("auto") is view and view.in_dtype("float32") is view
    with pytest.raises(ValueError, match="float16 is offered on CUDA only"):
        view.in_dtype("float16")
    assert set(view.variants) == {"bfloat16"}, "a refused dtype was asked for"


def test_a_model_off_the_allowlist_is_refused_before_the_engine_process_is_asked(view, monkeypatch):
    """The view refuses a model the allowlist does not name without sending the engine process
    a job; its own model (no name, or its id) is the view itself, no job either."""
    monkeypatch.setenv("CBP_MODEL_ALLOWLIST", "embedded")
    asked = []
    monkeypatch.setattr(view.worker, "run", lambda *args, **kwargs: asked.append(args))
    with pytest.raises(ModelLoadError, match="allowlist"):
        view.in_model("org/other")
    assert view.in_model(None) is view and view.in_model(view.model_id) is view
    assert not asked, f"the engine process was asked: {asked}"
