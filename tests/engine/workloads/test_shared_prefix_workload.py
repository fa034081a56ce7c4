"""The shipped shared-system-prompt workload and its page preset have the shape they promise."""

import os
from pathlib import Path

from engine.workloads.workload import load_jsonl

ASSETS = Path(__file__).resolve().parents[3] / "assets"


def test_twelve_requests_share_one_long_prompt_and_four_do_not():
    """Twelve prompts open with the same 2,000+ characters (several hundred tokens); four
    short prompts share none of it."""
    specs = load_jsonl(ASSETS / "workloads" / "shared_prefix.jsonl")
    opening = specs[0].prompt[:2000]
    shared = [s for s in specs if s.prompt.startswith(opening)]
    others = [s for s in specs if not s.prompt.startswith(opening[:20])]
    assert (len(shared), len(others), len(specs)) == (12, 4, 16)
    common = os.path.commonprefix([s.prompt for s in shared])
    assert len(common) > 2500, f"only {len(common)} characters in common"
    assert len({s.prompt for s in shared}) == 12, "the questions after the policy differ"
    assert all(len(s.prompt) < 60 for s in others)
    assert specs.index(others[0]) < specs.index(shared[-1]), "the others sit among the shared"
