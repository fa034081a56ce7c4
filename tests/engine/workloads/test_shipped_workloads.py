"""The bench workloads shipped in assets/workloads load and have the shape the README states."""

import statistics
from pathlib import Path

import pytest

from engine.workloads.workload import load_jsonl

WORKLOADS = Path(__file__).resolve().parents[3] / "assets" / "workloads"


@pytest.mark.parametrize("name", ["longtail.jsonl", "longtail_docs.jsonl"])
def test_long_tail_caps(name):
    """At least 48 requests, caps from 4 to 250, most short and a few long (a long tail)."""
    caps = [spec.max_new_tokens for spec in load_jsonl(WORKLOADS / name)]
    assert len(caps) >= 48, f"{name}: {len(caps)} requests"
    assert min(caps) == 4 and max(caps) == 250, f"{name}: caps {min(caps)}..{max(caps)}"
    median = statistics.median(caps)
    assert median <= max(caps) / 10, f"{name}: median cap {median} is not a long tail"


def test_docs_mix_adds_long_prompts_to_the_short_ones():
    """longtail_docs holds every longtail request, in order, plus 20 prompts over 10x longer."""
    short = [(s.prompt, s.max_new_tokens) for s in load_jsonl(WORKLOADS / "longtail.jsonl")]
    docs = [(s.prompt, s.max_new_tokens) for s in load_jsonl(WORKLOADS / "longtail_docs.jsonl")]
    assert [row for row in docs if row in short] == short, "the short mix, in its order"
    added = [len(prompt) for prompt, cap in docs if (prompt, cap) not in short]
    longest_short = max(len(prompt) for prompt, _ in short)
    assert len(added) == 20, f"{len(added)} document prompts"
    assert min(added) > 10 * longest_short and max(added) > 50 * longest_short, added
