"""Mask builders against small hand-written matrices."""

import torch

from engine.serving.masks import packed_layout, packed_step_mask, padded_wave_mask, query_layout


def test_packed_mask_decode_plus_prefill_matches_hand_written():
    """A (2 cached, 1 new) and B (0 cached, 3 new): keys laid out [A0 A1 | A2 B0 B1 B2]."""
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(packed_step_mask([2, 0], [1, 3]), expected)


def test_packed_mask_chunk_sees_its_cached_prefix():
    """A prefill chunk (2 cached, 2 new) sees its cached prefix and is causal within itself."""
    expected = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(packed_step_mask([2], [2]), expected)


def test_packed_mask_three_decodes_is_block_diagonal():
    """Three decoding sequences: each query sees only its own cached keys and its own new key."""
    mask = packed_step_mask([1, 2, 1], [1, 1, 1])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 1, 0, 0],
            [0, 1, 1, 0, 0, 1, 0],
            [0, 0, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_layout_positions_are_per_sequence():
    """Query positions restart per sequence and continue from its cached length."""
    q_seq, q_pos = query_layout([3, 0], [1, 2])
    assert q_seq.tolist() == [0, 1, 1]
    assert q_pos.tolist() == [3, 0, 1]
    layout = packed_layout([3, 0], [1, 2])
    assert layout.num_cached_keys == 3
    assert layout.k_pos.tolist() == [0, 1, 2, 3, 0, 1]


def test_padded_wave_mask_blocks_left_padding():
    """A left-padded row never attends to its pad keys; an unpadded row is plain causal."""
    mask = padded_wave_mask([1, 0], num_queries=1, num_keys=4)
    assert mask[:, 0].tolist() == [[False, True, True, True], [True, True, True, True]]
