"""Sampling settings of one request (as vLLM's): ``temperature`` 0 is greedy, ``top_k`` 0 and
``top_p`` 1 no limit, ``seed`` 0 to 2^63 - 1; unset ones default to 1, 0, 1, 0. No torch."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MAX_SEED = 2**63 - 1
FIELDS = ("temperature", "top_k", "top_p", "seed")  # the optional table and file columns
_EXACT_FLOAT_INT = 2**53  # integral floats above this may not be the number the user typed


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its next token. Raises ValueError: a temperature below 0 or not finite,
    top_p outside (0, 1], top_k or seed not a whole number in range; one message names every bad
    setting."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        problems = [
            problem
            for name in FIELDS
            if (problem := _field_problem(name, getattr(self, name))) is not None
        ]
        if problems:
            raise ValueError(" ".join(problems))
        # transformers' warpers want floats
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)


def _field_problem(name: str, value) -> str | None:
    if name == "temperature":
        if not _is_number(value) or not math.isfinite(value):
            return f"temperature {_show(value)} is not a finite number."
        if value < 0:
            return f"temperature {value} is below 0; use 0 (greedy) or a positive number."
    elif name == "top_p":
        if not _is_number(value) or not 0 < value <= 1:
            return f"top_p {_show(value)} is outside (0, 1]; use a number above 0, at most 1."
    elif isinstance(value, bool) or not isinstance(value, int):
        return f"{name} {_show(value)} is not a whole number."
    elif name == "top_k" and value < 0:
        return f"top_k {_show(value)} is below 0; use 0 (no limit) or more."
    elif name == "seed" and not 0 <= value <= MAX_SEED:
        return f"seed {_show(value)} is out of range; use 0 to {MAX_SEED} (2^63 - 1)."
    return None


def _is_number(value) -> bool:
    """An int or float that converts to a float (an int of 400 digits does not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _show(value) -> str:
    try:
        text = repr(value)
    except ValueError:  # Python's int-to-str digit limit
        return "(a number too long to print)"
    return text if len(text) <= 30 else text[:27] + "..."


def samples(params: SamplingParams | None) -> bool:
    return params is not None and not params.is_greedy


def parse_sampling(temperature, top_k, top_p, seed, where: str) -> SamplingParams | None:
    """Four table cells -> settings; None when all are blank (greedy). Raises ValueError: cells out
    of kind or range, all named in one message starting with ``where``."""
    cells = dict(zip(FIELDS, (temperature, top_k, top_p, seed), strict=True))
    given = {name: value for name, value in cells.items() if not is_blank(value)}
    if not given:
        return None
    values, problems = {}, []
    for name, value in given.items():  # every cell read and checked, so one message names all
        try:
            values[name] = (
                _whole(value, name) if name in ("top_k", "seed") else _number(value, name)
            )
        except ValueError as exc:
            problems.append(str(exc))  # each parse message is a sentence
            continue
        if (problem := _field_problem(name, values[name])) is not None:
            problems.append(problem)
    if problems:
        raise ValueError(f"{where}: " + " ".join(problems))
    return SamplingParams(**values)


def _number(value, name: str) -> float | int:
    """A number as typed: "2" stays the int 2, so a message quotes it as written."""
    text = _text(value, name)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number.") from None


def _whole(value, name: str) -> int:
    """A whole number, read exactly: "9223372036854775807" stays that number, "5.0" is 5."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = _text(value, name)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a whole number.") from None
    if not number.is_integer():
        raise ValueError(f"{name} {text} is not a whole number.")
    if abs(number) > _EXACT_FLOAT_INT:
        raise ValueError(f"{name} {text} is too large to read exactly; write it in digits.")
    return int(number)


def _text(value, name: str) -> str:
    try:
        return str(value).strip()
    except ValueError:  # Python's int-to-str digit limit
        raise ValueError(f"{name} is a number too long to read.") from None


def is_blank(value) -> bool:
    """None, NaN (pandas' empty cell) or only whitespace."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    try:
        return not str(value).strip()
    except ValueError:  # an int too long to print is not blank
        return False


def with_defaults(
    params: SamplingParams | None, defaults: SamplingParams | None, seed_base: int, index: int
) -> SamplingParams | None:
    """``params``, else ``defaults`` seeded ``seed_base + index``; None when neither is set. Raises
    ValueError: the seed beyond 2^63 - 1."""
    if params is not None or defaults is None:
        return params
    return SamplingParams(defaults.temperature, defaults.top_k, defaults.top_p, seed_base + index)
