"""vLLM's settings matched to our continuous engine's, and the keys that hold vLLM's first step:
checked on the flags the server would start with (no vLLM runs here)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig
from engine.peers import vllm_server
from engine.peers.vllm_server import matched_settings
from engine.sequence import Request

SCHEDULER = Path(vllm_server.__file__).with_name("vllm_scheduler.py")
CONFIG = SimpleNamespace(
    num_attention_heads=9, num_key_value_heads=3, head_dim=64, num_hidden_layers=30
)
LOADED = SimpleNamespace(
    source="/models/m",
    dtype=torch.float32,
    device=torch.device("cpu"),
    model=SimpleNamespace(config=CONFIG),
)
SIZES = [(10, 5), (40, 60), (7, 3)]  # (prompt tokens, max_new_tokens)
REQUESTS = [Request(i, "p", cap, tuple(range(n))) for i, (n, cap) in enumerate(SIZES)]


def _flags(settings) -> dict[str, str | None]:
    """The server's flags as {flag: value} (None for a switch)."""
    args, flags = settings.args(8000), {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else "--"
            flags[arg] = None if following.startswith("--") else following
    return flags


def test_paged_settings_match_ours_with_vllms_null_block():
    """continuous_paged: slots, token budget, block size, our blocks + vLLM's null block, prefix
    caching as ours, chunked prefill on, and a model length the pool holds; nothing unmatched."""
    config = EngineConfig(2, kv_mode="paged", block_size=32, max_num_batched_tokens=64)
    settings, unmatched = matched_settings(LOADED, config, REQUESTS, 5)
    flags = _flags(settings)
    assert unmatched == [], unmatched
    assert flags["--max-num-seqs"] == "2" and flags["--max-num-batched-tokens"] == "64"
    assert flags["--block-size"] == "32" and flags["--num-gpu-blocks-override"] == "6"
    assert flags["--max-model-len"] == str(5 * 32), "vLLM refuses a length its pool cannot hold"
    assert "--no-enable-prefix-caching" in flags and "--enable-chunked-prefill" in flags
    sharing = dataclasses.replace(config, prefix_caching=True)
    assert "--enable-prefix-caching" in _flags(matched_settings(LOADED, sharing, REQUESTS, 5)[0])


def test_a_block_size_vllms_cpu_cannot_take_is_rounded_up_and_said():
    """Blocks of 16 on a CPU: vLLM gets 32 (its CPU attention's multiple), and the line says how
    to match."""
    config = EngineConfig(2, kv_mode="paged", block_size=16)
    settings, unmatched = matched_settings(LOADED, config, REQUESTS, 9)
    assert settings.block_size == 32
    assert len(unmatched) == 1 and "--block-size 32" in unmatched[0], unmatched


def test_slot_settings_never_run_out_and_share_nothing():
    """continuous (slots): no prefix caching, no block override, and without a token budget one
    that never binds: the longest requests of every slot at once."""
    settings, unmatched = matched_settings(LOADED, EngineConfig(2), REQUESTS, None)
    flags = _flags(settings)
    assert unmatched == [] and "--num-gpu-blocks-override" not in flags
    assert flags["--max-num-batched-tokens"] == str((40 + 60) + (10 + 5))
    assert "--no-enable-prefix-caching" in flags


def test_the_hold_keys_are_the_same_on_both_sides():
    """The engine sends the hold in the vllm_xargs keys the recording scheduler reads."""
    tree = ast.parse(SCHEDULER.read_text())
    values = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
    }
    assert values["HOLD_FOR_KEY"] == vllm_server.HOLD_FOR_KEY
    assert values["HOLD_RUN_KEY"] == vllm_server.HOLD_RUN_KEY
    assert values["HOLD_ORDER_KEY"] == vllm_server.HOLD_ORDER_KEY


def test_the_model_length_stays_within_the_models_positions():
    """A model of 512 positions (a tiny family's) gets --max-model-len 512, which vLLM takes,
    not the 2,048 it refuses to start with; a config without the field keeps 2,048."""
    short = SimpleNamespace(**vars(CONFIG), max_position_embeddings=512)
    loaded = SimpleNamespace(**{**vars(LOADED), "model": SimpleNamespace(config=short)})
    assert _flags(vllm_server.settings_for(loaded, 2))["--max-model-len"] == "512"
    paged = matched_settings(loaded, EngineConfig(2, kv_mode="paged", block_size=32), REQUESTS, 64)
    assert _flags(paged[0])["--max-model-len"] == "512"
    assert _flags(vllm_server.settings_for(LOADED, 2))["--max-model-len"] == "2048"


def test_a_head_size_vllms_cpu_attention_lacks_is_refused_before_it_starts():
    """Heads of 16 values (a tiny family's): vLLM's engine would fail at the first request with
    no reason given; the settings say why up front. Heads of 64 start."""
    narrow = SimpleNamespace(**{**vars(CONFIG), "head_dim": 16})
    loaded = SimpleNamespace(**{**vars(LOADED), "model": SimpleNamespace(config=narrow)})
    with pytest.raises(ValueError, match="this model's have 16, so vLLM cannot serve it on a CPU"):
        vllm_server.settings_for(loaded, 2)
    assert vllm_server.settings_for(LOADED, 2).max_num_seqs == 2
