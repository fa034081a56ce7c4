"""The reference store on the tiny model: a stored reference equals a fresh one, a new process
reads it without running the model, every key field that can change a token misses, a corrupt
entry is recomputed with a warning, and prefix-stable caps are kept on disk."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging

import pytest
import torch
from tiny_model import make_requests, tiny_runner

from engine.fidelity import reference_store
from engine.fidelity.reference import ReferenceCache, SoloReference
from engine.model.model_runner import ModelRunner
from engine.sampling_params import SamplingParams

SAMPLING = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7)


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=5)


@pytest.fixture()
def store(tmp_path, monkeypatch) -> reference_store.ReferenceStore:
    """The host's store, in a temporary cache folder (never the user's)."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CBP_REFERENCE_CACHE", "on")
    store = reference_store.open_store()
    assert store is not None and store.folder == tmp_path / "references"
    return store


@pytest.fixture()
def requests():
    """Two greedy requests ("hello world" runs to its cap) and two sampled ones."""
    greedy = make_requests([("hello world", 16), ("the quick brown fox jumps", 12)])
    sampled = [
        dataclasses.replace(r, request_id=r.request_id + 2, sampling=SAMPLING) for r in greedy
    ]
    return greedy + sampled


def _count_runs(monkeypatch, reference) -> list:
    """Record every reference pass (``_run``) of ``reference``; replays are not counted."""
    calls = []
    run = reference._run

    def counted(request, on_step):
        calls.append(request.request_id)
        return run(request, on_step)

    monkeypatch.setattr(reference, "_run", counted)
    return calls


def _entries(store) -> list:
    return sorted(p for p in store.folder.glob("*/*.json") if p.name != "identity.json")


def _records(reference, requests) -> dict:
    return {r.request_id: list(reference.token_logits(r)) for r in requests}


@pytest.mark.parametrize("kind", [ReferenceCache, SoloReference])
def test_a_stored_reference_equals_a_fresh_one(runner, store, requests, kind):
    """Read back by a new object, a stored reference equals one computed without a store,
    token for token and logit record for logit record, greedy and sampled."""
    fresh = kind(runner)
    kind(runner, store=store).outputs(requests)
    stored = kind(runner, store=store)
    assert stored.outputs(requests) == fresh.outputs(requests), "stored tokens differ"
    assert _records(stored, requests) == _records(fresh, requests), "stored logit records differ"
    assert len(_entries(store)) == len(requests), "one entry per prompt and sampling settings"


def test_a_new_reference_on_the_same_folder_runs_nothing(runner, store, requests, monkeypatch):
    """A second ReferenceCache (a new process) answers every request from disk, with no
    ``generate`` call, and its verdicts equal the first one's."""
    first = ReferenceCache(runner, store)
    want = first.outputs(requests)
    second = ReferenceCache(runner, store)
    calls = []
    generate = runner.generate
    monkeypatch.setattr(runner, "generate", lambda *a, **k: calls.append(1) or generate(*a, **k))
    assert second.outputs(requests) == want
    assert not calls, f"{len(calls)} generate calls on a warm store"


def test_another_dtype_mode_seed_or_model_misses(runner, store, requests, monkeypatch):
    """An entry is used only for its own dtype, reference mode, sampling seed and model: each
    of those, changed, runs the model again."""
    ReferenceCache(runner, store).outputs(requests)
    sampled = requests[2]

    half = copy.copy(runner.loaded)
    half.model, half.dtype = copy.deepcopy(runner.model).to(torch.bfloat16), torch.bfloat16
    other_model = tiny_runner(seed=6)
    other_seed = dataclasses.replace(sampled, sampling=dataclasses.replace(SAMPLING, seed=8))
    cases = {
        "dtype": (ReferenceCache(ModelRunner(half), store), sampled),
        "batch-invariant mode": (SoloReference(runner, store=store), sampled),
        "sampling seed": (ReferenceCache(runner, store), other_seed),
        "model": (ReferenceCache(other_model, store), sampled),
    }
    for what, (reference, request) in cases.items():
        calls = _count_runs(monkeypatch, reference)
        reference.output(request)
        assert calls == [request.request_id], f"another {what} was answered from the store"
    assert ReferenceCache(runner, store).identity != SoloReference(runner, store=store).identity


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: "not json at all",
        lambda text: text[: len(text) // 2],  # half an entry
        lambda text: text.replace('"digests":[', '"digests":["zz",'),  # a bad digest
        lambda text: json.dumps({**json.loads(text), "output_token_ids": "1 2 3"}),
    ],
    ids=["garbage", "truncated", "bad-digest", "wrong-type"],
)
def test_a_corrupt_entry_is_recomputed_with_a_warning(
    runner, store, requests, monkeypatch, caplog, damage
):
    """A damaged entry is logged as a warning and recomputed (equal to a fresh reference), never
    an error, and the entry written again is good."""
    request = requests[0]
    want = ReferenceCache(runner, store).output(request)
    (path,) = _entries(store)
    path.write_text(damage(path.read_text()))
    reference = ReferenceCache(runner, store)
    calls = _count_runs(monkeypatch, reference)
    with caplog.at_level(logging.WARNING, logger=reference_store.__name__):
        assert reference.output(request) == want
    assert calls == [request.request_id], "a corrupt entry was used"
    assert any("corrupt" in r.message for r in caplog.records), "no warning said why"
    again = ReferenceCache(runner, store)
    calls = _count_runs(monkeypatch, again)
    assert again.output(request) == want and not calls, "the rewritten entry was not read back"


def test_a_shorter_cap_is_read_and_a_longer_cap_recomputes(runner, store, requests, monkeypatch):
    """A stored output answers any smaller cap (its prefix); a larger cap runs the model and
    replaces the entry, which then answers it."""
    request = requests[0]  # "hello world" runs to its cap without an EOS
    full = ReferenceCache(runner).output(dataclasses.replace(request, max_new_tokens=24))
    assert len(full) == 24, "the test needs an output that never ends early"

    def answer(cap: int) -> tuple[list[int], list]:
        reference = ReferenceCache(runner, store)
        calls = _count_runs(monkeypatch, reference)
        return reference.output(dataclasses.replace(request, max_new_tokens=cap)), calls

    assert answer(16) == (full[:16], [0])
    assert answer(6) == (full[:6], []), "a smaller cap ran the model"
    assert answer(24) == (full, [0]), "a larger cap was answered from a shorter entry"
    assert answer(24) == (full, []) and answer(20) == (full[:20], [])
    assert len(_entries(store)) == 1, "a larger cap did not replace the entry"


def test_entries_are_plain_json_written_whole(runner, store, requests):
    """The layout: one folder per identity with its identity.json, one JSON file per request,
    holding the key it was written for; no temporary file is left behind."""
    ReferenceCache(runner, store).outputs(requests)
    (folder,) = store.folder.iterdir()
    described = json.loads((folder / "identity.json").read_text())
    assert described["mode"]["reference"] == "generate" and described["dtype"] == "float32"
    entry = json.loads(_entries(store)[0].read_text())
    assert entry["prompt_token_ids"] in [list(r.prompt_token_ids) for r in requests]
    assert len(entry["token_logits"]["digests"]) == len(entry["output_token_ids"])
    assert not [p for p in store.folder.rglob("*") if p.name.endswith(".tmp")], "a tmp file left"


def test_the_folder_is_kept_under_its_bound(runner, store, requests):
    """After each write, least recently used entries are deleted until the folder fits."""
    ReferenceCache(runner, store).outputs(requests[:1])
    (first,) = _entries(store)
    store.max_bytes = first.stat().st_size  # room for about one entry
    ReferenceCache(runner, store).outputs(requests[1:])
    left = _entries(store)
    assert sum(p.stat().st_size for p in left) <= store.max_bytes, "the bound was exceeded"
    assert first not in left and left, "the oldest entry was kept, or everything was deleted"


def test_an_unwritable_folder_is_only_a_warning(runner, store, requests, caplog):
    """When the cache folder cannot be written, the reference is still answered (a warning)."""
    store.folder.parent.mkdir(parents=True, exist_ok=True)
    store.folder.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger=reference_store.__name__):
        assert ReferenceCache(runner, store).output(requests[0]) == ReferenceCache(runner).output(
            requests[0]
        )
    assert any("Could not write" in r.message for r in caplog.records)


def test_the_host_setting_turns_it_off(monkeypatch, tmp_path):
    """CBP_REFERENCE_CACHE=off gives no store; an unknown value is refused, naming the choices."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CBP_REFERENCE_CACHE", "off")
    assert reference_store.open_store() is None
    monkeypatch.setenv("CBP_REFERENCE_CACHE", "maybe")
    with pytest.raises(ValueError, match="CBP_REFERENCE_CACHE='maybe'.*'on'.*'off'"):
        reference_store.open_store()


def test_missing_names_what_a_reference_pass_would_compute(runner, store, requests, monkeypatch):
    """``missing`` lists every request before a pass, none after it (in memory, or on disk for a
    new object once its identity is known: hashing the weights is left to a pass), and a larger
    cap again; it computes nothing."""
    first = ReferenceCache(runner, store)
    calls = _count_runs(monkeypatch, first)
    assert len(first.missing(requests)) == len(requests) and not calls, "it ran the model"
    first.outputs(requests)
    assert first.missing(requests) == {}, "computed references still counted as missing"
    second = ReferenceCache(runner, store)
    assert len(second.missing(requests)) == len(requests), "read before its identity was known"
    assert second.identity  # known after its first pass in a process; then the store is read
    assert second.missing(requests) == {}, "stored references counted as missing"
    longer = [dataclasses.replace(requests[0], max_new_tokens=40)]
    assert list(second.missing(longer).values()) == [40], "a larger cap is not stored"
