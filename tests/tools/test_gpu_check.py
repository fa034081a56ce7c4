"""``make gpu-check``: a clear stop without CUDA, the planned runs, and the verdict's rule."""

import pytest

from tools import gpu_check


def test_gpu_check_stops_clearly_without_cuda(capsys):
    """make gpu-check on a machine without CUDA: exit 2 and a one-line reason."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--out", "unused"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_gpu_check_plans_every_required_run():
    """Parity in float32, float16 and bfloat16 with and without the mode, seed and long tail."""
    plan = dict(gpu_check.runs("embedded", 1))
    assert "float32" in plan["parity_float32"] and "--batch-invariant" not in plan["parity_float32"]
    for dtype in ("float16", "bfloat16"):
        assert "--batch-invariant" not in plan[f"divergence_{dtype}"]
        assert "--batch-invariant" in plan[f"divergence_{dtype}_invariant"]
    assert gpu_check.LONG_TAIL in plan["bench_longtail_float16"]
    assert all(argv[argv.index("--device") + 1] == "cuda" for argv in plan.values())


def test_gpu_check_fails_on_broken_parity_or_invariance_only():
    """Half-precision mismatches are recorded; float32 parity and invariance decide the verdict."""
    ok = {"num_match": 6, "num_logits_equal": 6, "num_near_tie": 0, "num_differs": 0}
    ties = {"num_match": 4, "num_logits_equal": 0, "num_near_tie": 2, "num_differs": 0}
    summary = [
        {"name": "parity_float32", "exit_status": 0, "batch_invariant": False, "engines": {}},
        {"name": "divergence_float16", "exit_status": 1, "batch_invariant": False,
         "engines": {"continuous": ties}},
        {"name": "divergence_float16_invariant", "exit_status": 0, "batch_invariant": True,
         "engines": {"continuous": ok}},
    ]  # fmt: skip
    assert gpu_check.failures(summary) == []
    summary[2]["engines"]["static"] = ties
    summary[0]["exit_status"] = 1
    assert gpu_check.failures(summary) == [
        "parity_float32: outputs differ from model.generate in float32",
        "divergence_float16_invariant: static is not bitwise equal to its solo runs",
    ]
