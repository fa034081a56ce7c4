"""The model allowlist: which models a host lets the app load (``CBP_MODEL_ALLOWLIST``, comma list;
``embedded`` is the default SmolLM2, ``*`` any model; unset: embedded only). Remote code is never
allowed: the loader passes ``trust_remote_code=False``."""

from __future__ import annotations

from engine import settings
from engine.model.loader import DEFAULT_MODEL, ModelLoadError

ALLOWLIST_ENV = "CBP_MODEL_ALLOWLIST"
ANY_MODEL = "*"


def allowed_models() -> list[str]:
    text = settings.value(ALLOWLIST_ENV)
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names or [DEFAULT_MODEL]


def check_model_allowed(model: str | None) -> None:
    """``model`` None is the embedded one. Raises ModelLoadError naming the variable to set."""
    wanted = (model or DEFAULT_MODEL).strip()
    allowed = allowed_models()
    if ANY_MODEL in allowed or wanted in allowed:
        return
    if wanted.lower() == DEFAULT_MODEL and DEFAULT_MODEL in (a.lower() for a in allowed):
        return
    raise ModelLoadError(
        f"Model {wanted!r} is not on this app's allowlist ({', '.join(allowed)}); "
        f"the host can allow it with {ALLOWLIST_ENV}={','.join([*allowed, wanted])}."
    )


def offered_models(loaded: str) -> list[str]:
    """The page picker's models: ``loaded`` first, then the allowlist's, without ``*``."""
    named = [name for name in allowed_models() if name != ANY_MODEL and name != loaded]
    return [loaded, *named]
