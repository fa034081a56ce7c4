"""The decode-step profile: torch ops sorted into matmuls, attention and the rest, per step."""

import pytest

from engine.bench.probes import step_profile
from tests.tiny_model import tiny_runner


@pytest.mark.parametrize(
    ("op", "group"),
    [
        ("mkldnn::_linear_pointwise", "matmul"),
        ("mkldnn::_linear_pointwise.binary", "matmul"),
        ("aten::addmm", "matmul"),
        ("aten::mm", "matmul"),
        ("cbp_gemv::linear", "matmul"),
        ("aten::scaled_dot_product_attention", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("cbp_attention::decode", "attention"),
        ("aten::rms_norm", "other"),
        ("aten::index_copy_", "other"),
    ],
)
def test_ops_fall_in_their_groups(op, group):
    """The linears' ops are matmuls, SDPA's are attention, norms and copies are the rest."""
    assert step_profile.op_group(op) == group


def test_a_profile_counts_decode_steps_only_and_splits_their_time():
    """Three sequences, 5 tokens each: the prefill step is not profiled, the 4 decode steps are;
    each group has time, the linears' among them, and the line names the three groups."""
    result = step_profile.decode_op_profile(tiny_runner(), num_slots=3, num_steps=4, prompt_len=7)
    assert result["num_steps"] == 4, result
    assert result["step_ms"] > 0 and result["matmul_ms"] > 0 and result["other_ms"] > 0, result
    assert result["attention_ms"] > 0, result
    assert result["other_ops"] > 0 and len(result["top_other"]) == step_profile.TOP_OTHER
    line = step_profile.profile_line(result)
    assert line.startswith("decode step under the profiler: ") and " matmuls " in line, line
    assert " attention " in line and " other ops " in line, line
