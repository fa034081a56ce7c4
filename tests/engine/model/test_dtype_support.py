"""A dtype the device cannot run is refused at once, naming the dtype and the device."""

import pytest
import torch

from engine.model import dtype_support, loader
from engine.model.dtype_support import check_dtype_supported, supported_dtypes


@pytest.fixture(autouse=True)
def _fresh_cache():
    dtype_support._unsupported.cache_clear()
    yield
    dtype_support._unsupported.cache_clear()


def test_the_cpu_runs_the_three_dtypes_here():
    """float32, bfloat16 and float16 all run on this CPU (half precision converted inside torch)."""
    assert supported_dtypes(torch.device("cpu")) == ["float32", "bfloat16", "float16"]
    check_dtype_supported(torch.device("cpu"), torch.bfloat16)


def test_a_dtype_without_cpu_kernels_is_refused_by_name():
    """float8 has no CPU matmul: the probe fails, and the message names the dtype and CPU."""
    with pytest.raises(ValueError, match=r"^float8_e4m3fn is not supported on CPU: .+ Use float32"):
        check_dtype_supported(torch.device("cpu"), torch.float8_e4m3fn)


def test_bfloat16_on_a_pre_ampere_gpu_is_refused(monkeypatch):
    """bfloat16 on a compute capability 7.5 GPU: refused, naming the GPU and what it needs."""
    monkeypatch.setattr(dtype_support, "_cuda_bf16_native", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(ValueError) as err:
        check_dtype_supported(torch.device("cuda"), torch.bfloat16)
    message = str(err.value)
    assert message.startswith("bfloat16 is not supported on CUDA (Tesla T4)"), message
    assert "compute capability 7.5" in message and "8.0 (Ampere)" in message, message


def test_load_model_refuses_before_reading_any_weight(monkeypatch):
    """load_model checks the dtype first: an unsupported one never reaches the weights."""
    monkeypatch.setattr(dtype_support, "_unsupported", lambda *args: "no kernels for it here")

    def no_load(*args, **kwargs):
        raise AssertionError("weights were read for a dtype the device cannot run")

    monkeypatch.setattr(loader, "_load_embedded", no_load)
    monkeypatch.setattr(loader, "_load_named", no_load)
    with pytest.raises(ValueError, match="^float16 is not supported on CPU: no kernels for it"):
        loader.load_model(device="cpu", dtype="float16")
