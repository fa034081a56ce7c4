"""The static engine's waves through the packed forward pass (``engine.batching.wave``): the
continuous engine's kernels, with the padding and the finished rows still computed, and the
same steps, outputs and trace as the left-padded ``generate`` waves."""

from __future__ import annotations

import time

from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.batching.wave import run_wave
from engine.config import EngineConfig

# three waves of 3: prompts of unequal length (padding), caps far apart (finished rows computed)
SPECS = [
    ("hello world", 5),
    ("a", 20),
    ("the quick brown fox", 9),
    ("xyz", 3),
    ("Once upon a time", 14),
    ("z" * 30, 6),
    ("q", 1),
    ("hello", 7),
]


def _steps(trace) -> list[tuple]:
    """Each step's wave and what every row computed in it."""
    return [
        (
            s.wave,
            [(q.request_id, q.slot, q.kind, q.num_new_tokens, q.num_cached_tokens) for q in s.seqs],
        )
        for s in trace.steps
    ]


def test_static_waves_run_packed_with_the_same_steps_as_generate(monkeypatch):
    """The default static engine calls ``forward_packed`` once a step, through the fused
    layers, its prefill packing each row's padding and prompt (B x W tokens); outputs, steps and
    the trace's rows equal those of the waves left-padded through ``generate``."""
    runner = tiny_runner()
    requests = make_requests(SPECS)
    config = EngineConfig(3)
    packed_tokens = []
    forward = runner.forward_packed

    def counted(batch, samplers=None):
        packed_tokens.append(batch.input_ids.shape[1])
        return forward(batch, samplers)

    monkeypatch.setattr(runner, "forward_packed", counted)
    fused_before = runner.decoder_layer_steps["fused"]
    packed = StaticEngine(runner, config).run(requests)
    assert len(packed_tokens) == len(packed.steps) > 20
    assert runner.decoder_layer_steps["fused"] - fused_before == len(packed.steps)
    prompts = [r.num_prompt_tokens for r in requests]
    prefills = [
        i for i, s in enumerate(packed.steps) if i == 0 or s.wave != packed.steps[i - 1].wave
    ]
    waves = [prompts[k : k + 3] for k in range(0, len(prompts), 3)]
    assert [packed_tokens[i] for i in prefills] == [len(w) * max(w) for w in waves]
    monkeypatch.undo()

    generated = StaticEngine(runner, config, engine_kernels=False).run(requests)
    assert [r.output_token_ids for r in packed.requests] == [
        r.output_token_ids for r in generated.requests
    ]
    assert _steps(packed) == _steps(generated)


def test_a_wave_records_the_logits_of_its_live_rows_only():
    """A wave's logits record has a row for each row still generating, None for a finished row
    and for the padding (their tokens are dropped); each recorded row's top token is the row's
    greedy token, and the static trace gives each request one record per output token."""
    runner = tiny_runner()
    wave = make_requests(SPECS[:3])  # prompts of 11, 1 and 19 tokens, caps 5, 20 and 9
    result = run_wave(runner, wave, time.perf_counter())
    eos = runner.eos_token_ids
    ends = [
        min(w.max_new_tokens, next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids)))
        for w, ids in zip(wave, result.token_ids, strict=True)
    ]
    assert len(set(ends)) > 1, "the rows should finish at different steps"
    for k, rows in enumerate(result.recorder.calls):
        assert len(rows) == (len(wave) + 2 if k == 0 else len(wave))  # step 0: two paddings
        for row, entry in enumerate(rows):
            live = row < len(wave) and k < ends[row]
            assert (entry is not None) == live, f"step {k}, row {row}: live {live}"
            if live:
                assert entry.token_ids[0] == result.token_ids[row][k]
    trace = StaticEngine(runner, EngineConfig(3)).run(make_requests(SPECS[:3]))
    for rec in trace.requests:
        assert len(rec.token_logits) == len(rec.output_token_ids) > 0


def test_partial_prefill_chunks_go_unrecorded():
    """With a token budget of 4, long prompts prefill in chunks: the continuous engine records
    no logits for a partial chunk (its logits are no next token), so each request keeps exactly
    one record per output token, whose top token is that output."""
    runner = tiny_runner()
    trace = ContinuousEngine(runner, EngineConfig(3, max_num_batched_tokens=4)).run(
        make_requests(SPECS[:3])
    )
    chunked = [
        s for s in trace.steps for q in s.seqs if q.kind == "prefill" and q.num_cached_tokens
    ]
    assert chunked, "some prompt should have been prefilled in more than one chunk"
    for rec in trace.requests:
        assert [t.token_ids[0] for t in rec.token_logits] == rec.output_token_ids
