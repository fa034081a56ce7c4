"""What an OpenAI-compatible server can do, asked once before its first run.

``probe`` sends one one-token request per variant, best first, and keeps the first accepted: prompt
ids with ``return_token_ids`` (vLLM), prompt ids (SGLang), text (``transformers serve``, which
refuses unknown fields). It reads ``/v1/models`` and ``/version``; a model other than the loaded one
warns and goes as text, since its tokenizer is another.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import httpx

from engine.peers.endpoints import Endpoint, EndpointError

PROBE_TIMEOUT_S = 60.0  # a first request may wait for a lazy model load (transformers serve)
PROBE_PROMPT = "Hello"
# (prompt as token ids, ask for token ids), best first
VARIANTS = ((True, True), (True, False), (False, False))


@dataclass
class ServerInfo:
    name: str
    url: str
    model: str | None  # sent as "model"; None: the server picks (it listed none)
    version: str | None  # from GET /version (vLLM, SGLang), else None
    prompt_token_ids: bool  # prompts sent as token ids (else as text)
    returns_token_ids: bool  # output ids from the server (else the text is re-tokenized here)
    warnings: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # the local vLLM's flags, when we started it
    # the served model is the loaded one (True), another (False), or unknown (None): only with
    # the same model do its outputs mean anything against the reference
    same_model: bool | None = None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "url": self.url,
            "model": self.model,
            "version": self.version,
            "prompt_format": "token_ids" if self.prompt_token_ids else "text",
            "output_token_ids": "server" if self.returns_token_ids else "retokenized",
            "settings": dict(self.settings),
            "same_model": self.same_model,
        }


def model_key(name: str) -> str:
    """A model name compared loosely: last path part, lowercase, no '@revision' or ':file.gguf'
    ("HuggingFaceTB/SmolLM2-135M-Instruct" -> "smollm2-135m-instruct")."""
    name = re.sub(r"\s*\(.*\)\s*$", "", name.strip())
    name = name.split("@")[0].split(":")[0] if "://" not in name else name
    return PurePosixPath(name.rstrip("/")).name.lower()


def probe(endpoint: Endpoint, loaded) -> ServerInfo:
    """Raises EndpointError: unreachable or refusing."""
    with httpx.Client(base_url=endpoint.url, timeout=httpx.Timeout(PROBE_TIMEOUT_S)) as client:
        models = _get_json(client, endpoint, "/v1/models")
        listed = [m.get("id") for m in (models or {}).get("data", []) if isinstance(m, dict)]
        listed = [m for m in listed if isinstance(m, str)]
        names = (getattr(loaded, "name", None), getattr(loaded, "source", None))  # folder, hub id
        keys = {model_key(n) for n in names if n}
        model = next((m for m in listed if model_key(m) in keys), listed[0] if listed else None)
        version = (_get_json(client, endpoint, "/version") or {}).get("version")
        ids = list(loaded.tokenizer(PROBE_PROMPT, add_special_tokens=True)["input_ids"])
        refusals = []
        for as_ids, want_ids in VARIANTS:
            body = {"prompt": ids if as_ids else PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
            body.update({"stream": True, **({"model": model} if model else {})})
            body.update({"return_token_ids": True} if want_ids else {})
            chunks, refusal = _try_stream(client, endpoint, body)
            if refusal is None:
                break
            refusals.append(refusal)
        else:
            raise EndpointError(
                f"{endpoint.name} ({endpoint.url}) refused every completion request: "
                + "; ".join(refusals)
            )
    served = model or next((c["model"] for c in chunks if isinstance(c.get("model"), str)), None)
    info = ServerInfo(
        name=endpoint.name,
        url=endpoint.url,
        model=model,
        version=version if isinstance(version, str) else None,
        prompt_token_ids=as_ids,
        returns_token_ids=any(_choice(c).get("token_ids") is not None for c in chunks),
        same_model=None if served is None else model_key(served) in keys,
    )
    info.warnings += _model_warnings(endpoint, served, keys, loaded)
    if info.same_model is False:  # its tokenizer is another: our token ids would be other words
        info.prompt_token_ids = info.returns_token_ids = False
    return info


def _model_warnings(endpoint: Endpoint, served: str | None, keys: set[str], loaded) -> list[str]:
    here = getattr(loaded, "name", "the loaded model")
    if served is None:
        return [
            f"{endpoint.name} does not say which model it serves; the output check assumes it is "
            f"{here}."
        ]
    if model_key(served) not in keys:
        return [
            f"{endpoint.name} serves {served!r}, not {here}: its outputs cannot be compared with "
            "the reference or the other engines, so their match means nothing."
        ]
    return []


def _choice(chunk: dict) -> dict:
    choices = chunk.get("choices") or [{}]
    return choices[0] if isinstance(choices[0], dict) else {}


def _get_json(client: httpx.Client, endpoint: Endpoint, path: str) -> dict | None:
    """GET ``path`` as JSON; None when the server lacks it. Raises EndpointError if unreachable.
    Retried once on a new connection: ``transformers serve`` closes a kept-alive one after a 500."""
    for attempt in range(2):
        try:
            response = client.get(path, headers={"Connection": "close"} if attempt else None)
            break
        except httpx.TransportError as exc:
            if attempt:
                raise unreachable(endpoint, exc) from exc
    if response.status_code != 200:
        return None
    try:
        doc = response.json()
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _try_stream(client: httpx.Client, endpoint: Endpoint, body: dict):
    try:
        with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return [], f"HTTP {response.status_code}: {error_detail(response.read())}"
            chunks = [c for line in response.iter_lines() if (c := parse_sse_line(line))]
    except httpx.TransportError as exc:
        raise unreachable(endpoint, exc) from exc
    errors = [c for c in chunks if "error" in c]
    if errors:
        return [], f"stream error: {error_detail(json.dumps(errors[0]).encode())}"
    return chunks, None


def parse_sse_line(line: str) -> dict | None:
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def error_detail(body: bytes, limit: int = 300) -> str:
    """The readable part of an error body: OpenAI's ``error.message``, FastAPI's ``detail``."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:limit] or "(empty answer)"
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("detail", doc))
        if isinstance(err, dict):
            err = err.get("message", err)
        text = str(err)
    return text[:limit]


def unreachable(endpoint: Endpoint, exc: Exception) -> EndpointError:
    return EndpointError(
        f"Cannot reach {endpoint.name} at {endpoint.url} ({type(exc).__name__}: {exc}); "
        "is the server running, and is the URL right?"
    )
