"""The reference key: everything that can change a reference's tokens or logits, hashed, including
a SHA-256 of the sources a ``mode`` runs through (an edit is a miss, never a stale reference).
No cap: references are prefix-stable."""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.model.device import cpu_model
from engine.sampling_params import SamplingParams
from engine.token_logits import DIGEST_BYTES, TOP_K

_SHA_CHUNK_BYTES = 2**24  # weights are hashed in slices of at most this many bytes


@dataclass(frozen=True)
class Identity:
    """``fields`` (JSON values) and their SHA-256 ``digest``."""

    fields: dict[str, Any]
    digest: str


def identity_fields(runner, mode: dict[str, Any], weights_sha256: str) -> dict[str, Any]:
    """The identity of ``runner``'s model in one reference ``mode``, as JSON values."""
    import transformers  # heavy: imported when an identity is made, not with this module

    model = runner.model
    config = json.loads(model.config.to_json_string(use_diff=False))
    config.pop("_name_or_path", None)  # where it was loaded from, not what it computes
    return {
        "model": getattr(runner.loaded, "name", None),
        "model_class": type(model).__name__,
        "weights_sha256": weights_sha256,
        "config": config,
        "generation_config": json.loads(model.generation_config.to_json_string(use_diff=False)),
        "attention": model.config._attn_implementation,
        "dtype": str(runner.dtype).removeprefix("torch."),
        "device": device_fields(runner.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "eos_token_ids": sorted(runner.eos_token_ids),
        "pad_token_id": runner.pad_token_id,
        "logit_record": {"top_k": TOP_K, "digest_bytes": DIGEST_BYTES},
        "mode": mode,
    }


def request_fields(prompt: tuple[int, ...], sampling: SamplingParams | None) -> dict[str, Any]:
    return {
        "prompt_token_ids": [int(t) for t in prompt],
        "sampling": None if sampling is None else sampling.to_dict(),
    }


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's and buffer's name, dtype,
    shape and bytes (540 MB: under 1 s)."""
    sha = hashlib.sha256()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        raw = tensor.detach().contiguous().reshape(-1).cpu().view(torch.uint8)  # (bytes,)
        sha.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        for start in range(0, raw.numel(), _SHA_CHUNK_BYTES):
            sha.update(raw[start : start + _SHA_CHUNK_BYTES].numpy().data)
    return sha.hexdigest()


def device_fields(device: torch.device) -> dict[str, Any]:
    """The device's type and the CPU's kernel dispatch (capability, model, threads) or the GPU's
    name, compute capability and CUDA version."""
    fields: dict[str, Any] = {"type": device.type, "machine": platform.machine()}
    if device.type == "cpu":
        fields["capability"] = torch.backends.cpu.get_cpu_capability()
        fields["cpu"] = cpu_model()
        fields["threads"] = torch.get_num_threads()
    elif device.type == "cuda":
        fields["name"] = torch.cuda.get_device_name(device)
        fields["capability"] = list(torch.cuda.get_device_capability(device))
        fields["cuda"] = torch.version.cuda
    return fields


def code_digest(paths: list[Path]) -> str:
    sha = hashlib.sha256()
    for path in paths:
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()
