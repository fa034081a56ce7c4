"""The model picker on the host's allowlist: two tiny folders of different families, switched on
the page's engine thread (as on ZeroGPU; the engine process runs the same jobs), each run judged
against ``generate`` of its own model; a refused or broken model is told as "Not run"."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from family_models import WINDOW, save_family_folder

from engine.config import EngineConfig
from engine.model.loader import load_model
from engine.page.figures import mask_heatmaps
from engine.page.handlers import model_choice, playground
from engine.page.run import shared_model
from engine.page.views import run_view
from engine.worker.comparison import ComparisonJob, work_in_worker
from engine.workloads.workload import parse_table, tokenize_requests

ROWS = [["the quick brown fox jumps over the lazy dog", 6], ["hello", 14]]  # past 8 keys


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """A tiny Llama and a tiny Mistral (an 8-key window), saved as folders."""
    root = tmp_path_factory.mktemp("models")
    return {family: save_family_folder(family, root / family) for family in ("llama", "mistral")}


@pytest.fixture(scope="module")
def started(folders, tmp_path_factory):
    """The page's model: the Llama folder, loaded here with both folders allowed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CBP_MODEL_ALLOWLIST", f"{folders['llama']},{folders['mistral']}")
        patch.setenv("CBP_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        patch.setenv("CBP_ENGINE_KERNEL", "linear")  # no kernel timing: seconds, not minutes
        patch.setattr(shared_model, "_shared_model", None)
        model = shared_model.load_shared_model(folders["llama"], "cpu", None, calibrate=False)
        yield model


def _requests(model):
    specs = parse_table(ROWS)
    return tokenize_requests(specs, model.loaded.tokenizer, chat_template=False, max_context=512)


def _generate(folder: str, request) -> list[int]:
    """``generate`` of ``folder``'s model, loaded afresh, greedy: the new token ids."""
    loaded = load_model(folder, "cpu", None)
    prompt = torch.tensor([request.prompt_token_ids])
    with torch.no_grad():
        out = loaded.model.generate(
            prompt, max_new_tokens=request.max_new_tokens, do_sample=False, pad_token_id=0
        )
    ids = out[0, prompt.shape[1] :].tolist()
    for i, token in enumerate(ids):  # up to and with the first EOS, as the engines stop
        if token in loaded.eos_token_ids:
            return ids[: i + 1]
    return ids


def test_the_picker_loads_the_chosen_model_and_names_it(started, folders):
    """A pick of the Mistral folder tells its load's stages, then a model line naming its
    family in words, size, dtype and folder (on hover); picking the Llama again names the
    Llama."""
    updates = list(model_choice.choose_model_event(folders["mistral"]))
    line, status = updates[-1]
    assert status.startswith("**Model ready:**"), status
    for word in (" · Mistral · ", "parameters", "float32", folders["mistral"]):
        assert word in line, f"{word!r} not in the model line {line!r}"
    assert "llama" not in line.split("·")[1], line
    line, status = list(model_choice.choose_model_event(folders["llama"]))[-1]
    assert " · Llama · " in line and folders["llama"] in line, line


def test_a_run_on_each_model_is_judged_against_its_own_generate(started, folders):
    """The engines on each chosen model equal ``generate`` of that very model (loaded afresh),
    and the two models' outputs differ, so a run on the wrong one would show."""
    outputs = {}
    for family in ("llama", "mistral"):
        model = shared_model.chosen_model(folders[family])
        requests = _requests(model)
        job = ComparisonJob(requests, EngineConfig(2), check_reference=True, model=model.model_id)
        result = work_in_worker(started.worker.model, job, lambda *a, **k: None)
        wanted = {r.request_id: _generate(folders[family], r) for r in requests}
        assert result.reference == wanted, f"{family}: the reference is not its generate"
        for engine, verdicts in result.verdicts.items():
            assert all(v["verdict"] == "match" for v in verdicts.values()), (family, engine)
        outputs[family] = result.reference
    assert outputs["llama"] != outputs["mistral"], "both runs ran on one model"


def test_the_page_runs_the_picked_model_with_its_window(started, folders):
    """Run with ``model`` set runs that model: its trace carries the Mistral's sliding window,
    which the mask's layer types offer."""
    knobs = (2, False, True, "slots", 0, "decode_first", False, 0, "time")
    *_, final = playground.run_event(ROWS, *knobs, replay_recent=False, model=folders["mistral"])
    state = final[run_view.RUN_OUTPUTS.index("run_state")]
    status = final[run_view.RUN_OUTPUTS.index("status_markdown")]
    assert isinstance(state, run_view.RunState), f"no run: {status}"
    types = mask_heatmaps.layer_types(state.continuous)
    assert types.get(f"sliding (window {WINDOW})") == WINDOW, f"no {WINDOW}-key window: {types}"


def test_a_load_waits_for_the_run_in_progress(started, folders):
    """While a run holds the model's lock, a pick says it waits and loads nothing; it loads
    once the lock is free."""
    started.models.clear()  # the Mistral not held: its pick must load
    started.lock.acquire()
    events = model_choice.choose_model_event(folders["mistral"])
    try:
        first = next(events)
        time.sleep(2 * model_choice.LOAD_POLL_S)
        assert "waiting for the run in progress" in first[1], first
        assert not started.models, "a model loaded while a run held the lock"
    finally:
        threading.Timer(0.5, started.lock.release).start()
    line, status = list(events)[-1]
    assert "mistral" in line and status.startswith("**Model ready:**"), status


@pytest.mark.parametrize("case", ["not allowed", "no weights"])
def test_a_model_that_cannot_run_is_told_not_run(started, folders, tmp_path, monkeypatch, case):
    """A folder off the allowlist, or allowed but without weights, says "Not run: ... because"
    with the reason, no traceback; the model line is left as it was."""
    empty = tmp_path / "empty"
    empty.mkdir()
    if case == "no weights":
        allowed = f"{folders['llama']},{folders['mistral']},{empty}"
        monkeypatch.setenv("CBP_MODEL_ALLOWLIST", allowed)
    (line, status), *rest = list(model_choice.choose_model_event(str(empty)))[::-1]
    assert status.startswith(f"**Not run:** `{empty}` cannot run here, because"), status
    assert "Traceback" not in status and line == model_choice.gr.skip(), status
    if case == "not allowed":
        assert "allowlist" in status, status
