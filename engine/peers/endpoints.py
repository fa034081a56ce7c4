"""Endpoints: the OpenAI-compatible servers a host lets the playground and the bench drive
(``NAME=URL``, with an optional record address), parsed once. Host-side only: no URL comes from
a page visitor, so a public page is no proxy."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from urllib.parse import urlparse

from engine import settings

ENDPOINTS_ENV = "CBP_ENDPOINTS"
RECORDS_ENV = "CBP_ENDPOINT_RECORDS"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")


class EndpointError(ValueError):
    """A server could not do its part of a run (unreachable, HTTP 4xx/5xx, a stream cut, a local
    vLLM that fails to start); the message is for a person. ``trace``: what the run recorded until
    then (None before a run began)."""

    def __init__(self, message: str, trace=None):
        super().__init__(message)
        self.trace = trace


class MissingBuild(ValueError):
    """A local server's build is missing (``make vllm``, ``make llamacpp``); the message names the
    path and the command, ``public`` says it without the path, for a page."""

    def __init__(self, message: str, public: str):
        super().__init__(message)
        self.public = public


class ModelRefused(ValueError):
    """A local server cannot serve this model; ``public`` says why without a host's path."""

    def __init__(self, message: str, public: str | None = None):
        super().__init__(message)
        self.public = public or message


@dataclass(frozen=True)
class Endpoint:
    name: str  # engine name: letters, digits, '_', '.', '-' (at most 40)
    url: str  # base URL without a trailing '/' or '/v1', e.g. "http://127.0.0.1:8000"
    record_url: str | None = None  # where its server serves its record of its steps; None: none


def parse_endpoint(text: str, where: str = "--endpoint") -> Endpoint:
    """``NAME=URL`` -> ``Endpoint``. Raises ValueError: no '=', a bad name, or a URL that is not
    ``http(s)://host[:port][/path]``."""
    name, sep, url = text.strip().partition("=")
    name, url = name.strip(), url.strip()
    if not sep or not name or not url:
        raise ValueError(
            f"{where} {text!r}: write it as NAME=URL, e.g. vllm_gpu=http://10.0.0.5:8000."
        )
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{where} {text!r}: the name {name!r} must start with a letter or digit and hold only "
            "letters, digits, '_', '.' or '-' (at most 40 characters)."
        )
    root = _checked_url(url, f"{where} {text!r}").rstrip("/").removesuffix("/v1").rstrip("/")
    return Endpoint(name, root)


def _checked_url(url: str, where: str) -> str:
    """Raises ValueError saying why ``url`` is not ``http(s)://host[:port][/path]``."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{where}: the URL must start with http:// or https:// and name a host.")
    if parsed.query or parsed.fragment:
        raise ValueError(f"{where}: the URL must not have a query ('?') or fragment ('#').")
    try:
        parsed.port  # noqa: B018  (raises on a port that is not a number from 0 to 65535)
    except ValueError:
        raise ValueError(f"{where}: the port must be a number from 1 to 65535.") from None
    return url


def parse_endpoints(
    items: Iterable[str], reserved: Iterable[str] = (), where: str = "--endpoint"
) -> list[Endpoint]:
    """``reserved``: names already taken (the built-in engines). Raises ValueError: a bad entry, or
    a name used twice or taken by a built-in engine."""
    taken = set(reserved)
    endpoints: list[Endpoint] = []
    for item in items:
        endpoint = parse_endpoint(item, where)
        if endpoint.name in taken:
            kind = "a built-in engine" if endpoint.name in set(reserved) else "another endpoint"
            raise ValueError(
                f"{where} {item!r}: the name {endpoint.name!r} is already used by {kind}; "
                "pick another name."
            )
        taken.add(endpoint.name)
        endpoints.append(endpoint)
    return endpoints


def with_records(
    endpoints: list[Endpoint], items: Iterable[str], where: str = "--endpoint-record"
) -> list[Endpoint]:
    """``endpoints``, each with the record URL (``RecordFeed``'s address, not the API) that
    ``items`` gives it. Raises ValueError: a bad entry, a name that no endpoint has, or a name given
    twice."""
    urls: dict[str, str] = {}
    names = {e.name for e in endpoints}
    for item in items:
        name, sep, url = (part.strip() for part in item.strip().partition("="))
        if not sep or not name or not url:
            raise ValueError(
                f"{where} {item!r}: write it as NAME=RECORD_URL, e.g. gpu=http://10.0.0.5:8100."
            )
        if name not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ValueError(
                f"{where} {item!r}: no endpoint is named {name!r} (endpoints: {known}); give "
                f"--endpoint {name}=URL for its API as well."
            )
        if name in urls:
            raise ValueError(f"{where} {item!r}: {name!r} has a record URL already.")
        urls[name] = _checked_url(url, f"{where} {item!r}").rstrip("/")
    return [replace(e, record_url=urls.get(e.name, e.record_url)) for e in endpoints]


def endpoints_from_env(
    environ: Mapping[str, str] | None = None, reserved: Iterable[str] = ()
) -> list[Endpoint]:
    """``CBP_ENDPOINTS`` (``name=url,name2=url2``); [] when unset. Raises ValueError naming the
    variable."""
    text = settings.value(ENDPOINTS_ENV, environ)
    items = [item for item in text.split(",") if item.strip()]
    return parse_endpoints(items, reserved, where=f"{ENDPOINTS_ENV} entry")


def records_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    text = settings.value(RECORDS_ENV, environ)
    return [item for item in text.split(",") if item.strip()]
