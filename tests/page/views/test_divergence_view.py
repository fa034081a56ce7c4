"""Where outputs differ: equal logits in the top 5 show as ties, the chosen token first, with one
sentence on how greedy decoding breaks a tie."""

from __future__ import annotations

import torch

from engine.fidelity.divergence import NEAR_TIE
from engine.page.views import divergence_view

TEXTS = {3: " different", 4: " same", 7: " extreme", 11: " new", 2: " odd"}


def _side(pairs: list[tuple[int, float]]) -> dict:
    """One run's recorded top, in the order given (topk's, arbitrary among equal logits)."""
    top = [{"token_id": t, "logit": z, "text": TEXTS[t]} for t, z in pairs]
    return {"reference_token_logit": 26.5, "engine_token_logit": 26.5, "top": top}


def _verdicts(reference_top, engine_top, reference_token=3, engine_token=7) -> dict:
    entry = {
        "request_id": 0,
        "verdict": NEAR_TIE,
        "label": "≈ near-tie at token 4",
        "token_index": 4,
        "reason": "a near-tie",
        "reference_token": reference_token,
        "engine_token": engine_token,
        "rounding_bound": 0.4,
        "prefix_text": "It is a",
        "reference_token_text": repr(TEXTS[reference_token]),
        "engine_token_text": repr(TEXTS[engine_token]),
        "reference_run": _side(reference_top),
        "engine_run": _side(engine_top),
    }
    return {"continuous": {0: entry}}


def test_equal_logits_share_a_rank_with_the_chosen_token_first():
    """Three tokens at logit 26.5, listed by topk with the reference's choice third, show as
    rank 1 each with the chosen first; the engine's untied top keeps ranks 1 and 2; each row is
    one token, with its rank and logit in both runs; the markdown says once how argmax breaks a
    tie."""
    reference = [(7, 26.5), (4, 26.5), (3, 26.5), (11, 25.0), (2, 24.0)]
    engine = [(7, 26.75), (4, 26.5), (3, 26.5), (11, 25.0), (2, 24.0)]
    markdown, _, rows = divergence_view.view(_verdicts(reference, engine), None, "bfloat16")
    by = divergence_view.CHOSEN.format
    assert rows == [
        [f"' different'{by('reference')}", "1", "26.5", "2", "26.5"],
        ["' same'", "1", "26.5", "2", "26.5"],
        [f"' extreme'{by('engine')}", "1", "26.5", "1", "26.75"],
        ["' new'", "4", "25", "4", "25"],
        ["' odd'", "5", "24", "5", "24"],
    ], rows
    assert markdown.count(divergence_view.TIES_NOTE) == 1, markdown


def test_without_ties_the_ranks_are_positions_and_no_note_is_added():
    """A top 5 with distinct logits keeps its order and ranks 1 to 5, and the note is left out."""
    distinct = [(3, 26.5), (7, 26.0), (4, 25.5), (11, 25.0), (2, 24.0)]
    markdown, _, rows = divergence_view.view(_verdicts(distinct, distinct, 3, 3), None, None)
    assert [row[1] for row in rows] == ["1", "2", "3", "4", "5"], rows
    assert [row[3] for row in rows] == ["1", "2", "3", "4", "5"], rows
    assert [row[0] for row in rows][1:] == ["' extreme'", "' same'", "' new'", "' odd'"], rows
    both = divergence_view.CHOSEN.format("reference and engine")
    assert rows[0][0] == f"' different'{both}", rows
    assert divergence_view.TIES_NOTE not in markdown, markdown


def test_argmax_breaks_a_tie_by_the_lower_token_id():
    """The note's claim: greedy's argmax over the vocabulary picks the lowest id among equal
    logits (as the model runner calls it, on a (B, V) row)."""
    logits = torch.tensor([[1.0, 20.0, 26.5, 3.0, 26.5, 26.5]])  # (B, V)
    assert logits.argmax(dim=-1).tolist() == [2], "argmax did not pick the first maximum"


def test_a_common_prefix_of_whitespace_is_shown_not_blank():
    """A common prefix of two newlines shows as '\\n\\n', never as an empty box; a prefix with
    words shows as it is."""
    verdicts = _verdicts([(3, 26.5)], [(7, 26.5)])
    verdicts["continuous"][0]["prefix_text"] = "\n\n"
    _, text, _ = divergence_view.view(verdicts, "continuous:0", "bfloat16")
    assert text.startswith("Common prefix (4 tokens):\n'\\n\\n'\n\n"), (
        f"whitespace not shown: {text!r}"
    )
    verdicts["continuous"][0]["prefix_text"] = "It is a"
    _, text, _ = divergence_view.view(verdicts, "continuous:0", "bfloat16")
    assert text.startswith("Common prefix (4 tokens):\nIt is a\n\n"), text
