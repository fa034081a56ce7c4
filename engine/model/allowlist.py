"""The model allowlist: which models a host lets the app load, checked before any load.

A Space owner sets ``CBP_MODEL_ALLOWLIST`` to a comma-separated list of model ids or folders
(``embedded`` is the default SmolLM2; ``*`` allows any model). Unset, only the embedded model may
load. Remote code is never allowed whatever the list says: ``engine.model.loader`` always passes
``trust_remote_code=False``.
"""

from __future__ import annotations

from engine import settings
from engine.model.loader import DEFAULT_MODEL, ModelLoadError

ALLOWLIST_ENV = "CBP_MODEL_ALLOWLIST"
ANY_MODEL = "*"


def allowed_models() -> list[str]:
    """The allowlist in force, from ``CBP_MODEL_ALLOWLIST``; ``["embedded"]`` when unset."""
    text = settings.value(ALLOWLIST_ENV)
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names or [DEFAULT_MODEL]


def check_model_allowed(model: str | None) -> None:
    """Return if ``model`` (None means the embedded one) is on the allowlist.

    Raises:
        ModelLoadError: the model is not on the list; the message names the variable to set.
    """
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
    """The models a page's picker offers: the allowlist's, ``loaded`` (the one app.py loaded)
    first, without ``*``."""
    named = [name for name in allowed_models() if name != ANY_MODEL and name != loaded]
    return [loaded, *named]
