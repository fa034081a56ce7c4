"""Workloads: the user's list of (prompt, max_new_tokens), validated and tokenized. Every problem
raises a ``ValueError`` a person can act on, several bad rows in one message."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from engine import settings
from engine.sampling_params import FIELDS as SAMPLING_FIELDS
from engine.sampling_params import SamplingParams, is_blank, parse_sampling
from engine.sequence import Request

MAX_ROWS = int(settings.default("CBP_MAX_ROWS"))  # requests per run
MAX_NEW_TOKENS_LIMIT = int(settings.default("CBP_MAX_NEW_TOKENS"))  # per-request cap
MAX_PROMPT_CHARS = int(settings.default("CBP_MAX_PROMPT_CHARS"))  # per prompt
MAX_NAMED_PROBLEMS = 5  # bad rows or lines named in one message; the rest are counted


@dataclass(frozen=True)
class Limits:
    max_rows: int
    max_new_tokens: int
    max_prompt_chars: int


def limits() -> Limits:
    """``CBP_MAX_ROWS``, ``CBP_MAX_NEW_TOKENS``, ``CBP_MAX_PROMPT_CHARS``. Raises ValueError: not a
    positive whole number."""
    return Limits(
        max_rows=settings.count("CBP_MAX_ROWS"),
        max_new_tokens=settings.count("CBP_MAX_NEW_TOKENS"),
        max_prompt_chars=settings.count("CBP_MAX_PROMPT_CHARS"),
    )


SEED_REQUESTS = (
    ("The capital of France is", 6),
    ("Today's weather is so", 50),
    ("In machine learning, a transformer is", 300),
    ("Once upon a time in a land far away,", 30),
    ("Quantum computing differs from classical computing because", 180),
    ("The history of the Roman Empire began", 45),
)


@dataclass(frozen=True)
class RequestSpec:
    prompt: str
    max_new_tokens: int
    arrival_s: float = 0.0  # seconds after the run starts
    sampling: SamplingParams | None = None  # None: greedy


def seed_specs() -> list[RequestSpec]:
    return [RequestSpec(p, n) for p, n in SEED_REQUESTS]


def parse_cap(value, where: str) -> int:
    """Ints, integral floats and their strings. Raises ValueError: empty, not whole, < 1 or over the
    limit."""
    limit = limits().max_new_tokens
    text = _text(value, where, "max_new_tokens").strip() if value is not None else ""
    if text == "" or (isinstance(value, float) and math.isnan(value)):
        raise ValueError(
            f"{where}: max_new_tokens is empty; enter a whole number from 1 to {limit}."
        )
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{where}: max_new_tokens {text!r} is not a number.") from None
    if not number.is_integer():
        raise ValueError(f"{where}: max_new_tokens {text} is not a whole number.")
    cap = int(number)
    if not 1 <= cap <= limit:
        raise ValueError(f"{where}: max_new_tokens {cap} is out of range; use 1 to {limit}.")
    return cap


def parse_prompt(prompt, where: str) -> str:
    """Raises ValueError naming ``where``: blank, or over the limit."""
    if is_blank(prompt):
        raise ValueError(f"{where}: the prompt is blank.")
    text = _text(prompt, where, "the prompt")
    max_chars = limits().max_prompt_chars
    if len(text) > max_chars:
        raise ValueError(
            f"{where}: the prompt has {len(text)} characters, over the limit of {max_chars}."
        )
    return text


def row_spec(prompt, cap, arrival, sampling: tuple | list, where: str) -> RequestSpec:
    """One request's cells -> its spec (``arrival`` blank: 0; sampling cells all blank: greedy).
    Raises ValueError naming ``where`` once, then each problem a sentence."""
    problems: list[str] = []

    def told(parse, *args):
        try:
            return parse(*args)
        except ValueError as exc:
            problems.append(str(exc).removeprefix(f"{where}: "))
            return None

    text = told(parse_prompt, prompt, where)
    max_new_tokens = told(parse_cap, cap, where)
    arrival_s = 0.0 if is_blank(arrival) else told(parse_arrival, arrival, where)
    cells = (list(sampling) + [None] * len(SAMPLING_FIELDS))[: len(SAMPLING_FIELDS)]
    params = told(parse_sampling, *cells, where)
    if problems:
        raise ValueError(f"{where}: " + " ".join(_sentence(p) for p in problems))
    return RequestSpec(text, max_new_tokens, arrival_s, params)


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."


TABLE_COLUMNS = ("prompt", "max_new_tokens", "arrival_s", *SAMPLING_FIELDS)


def parse_table(rows) -> list[RequestSpec]:
    """Rows of ``TABLE_COLUMNS`` cells -> specs; columns after ``max_new_tokens`` are optional,
    blank rows skipped. Raises ValueError: no request, bad rows (by 1-based number), too many rows.
    """
    specs, problems = [], []
    width = len(TABLE_COLUMNS)
    for i, row in enumerate(rows or [], start=1):
        cells = (list(row) + [None] * width)[:width]
        if all(is_blank(cell) for cell in cells):
            continue
        prompt, cap, arrival, *sampling = cells
        try:
            specs.append(row_spec(prompt, cap, arrival, sampling, f"Row {i}"))
        except ValueError as exc:
            problems.append(str(exc))
    raise_problems(problems, "bad rows")
    return checked_count(specs)


def raise_problems(problems: list[str], what: str = "problems") -> None:
    """One ValueError naming the first ``MAX_NAMED_PROBLEMS`` and counting the rest ("… and 7 more
    bad lines."); with one problem, exactly its message. Nothing when empty."""
    if not problems:
        return
    message = " ".join(problems[:MAX_NAMED_PROBLEMS])
    if len(problems) > MAX_NAMED_PROBLEMS:
        message += f" … and {len(problems) - MAX_NAMED_PROBLEMS} more {what}."
    raise ValueError(message)


def load_jsonl(path: str | Path) -> list[RequestSpec]:
    """One ``{"prompt": str, "max_new_tokens": int}`` per line, optionally ``arrival_s`` and the
    sampling keys; others ignored. Raises ValueError: an unreadable or non-UTF-8 file, or bad lines
    (by number)."""
    path = Path(path)
    lines = read_workload_text(path).splitlines()
    specs, problems = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            specs.append(_jsonl_spec(line, f"{path.name} line {number}"))
        except ValueError as exc:
            problems.append(str(exc))
    raise_problems(problems, "bad lines")
    return checked_count(specs)


def _jsonl_spec(line: str, where: str) -> RequestSpec:
    """Raises ValueError naming ``where``."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg}).") from None
    if not isinstance(obj, dict) or "prompt" not in obj or "max_new_tokens" not in obj:
        raise ValueError(f'{where}: expected {{"prompt": ..., "max_new_tokens": ...}}.')
    sampling = [obj.get(name) for name in SAMPLING_FIELDS]
    arrival = obj.get("arrival_s")
    if "arrival_s" in obj and arrival is None:  # a null arrival_s is refused, as before
        arrival = "null"
    return row_spec(obj["prompt"], obj["max_new_tokens"], arrival, sampling, where)


def read_workload_text(path: str | Path) -> str:
    """UTF-8 text, a leading BOM dropped. Raises ValueError naming the file: unreadable or not
    UTF-8."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ValueError(f"Cannot read workload file {path.name}: {exc.strerror}.") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path.name} is not UTF-8 text; save it as UTF-8.") from None


def parse_arrival(value, where: str) -> float:
    """Seconds >= 0. Raises ValueError naming ``where``."""
    text = _text(value, where, "arrival_s")
    try:
        arrival = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: arrival_s {text!r} is not a number of seconds.") from None
    if not math.isfinite(arrival) or arrival < 0:
        raise ValueError(f"{where}: arrival_s must be a finite number of seconds >= 0.")
    return arrival


def poisson_arrivals(specs: list[RequestSpec], rate_per_s: float, seed: int) -> list[RequestSpec]:
    """The specs arriving as a Poisson process of ``rate_per_s`` (exponential gaps, the first after
    one gap; reproducible by ``seed``). Raises ValueError: a rate that is not positive."""
    if not rate_per_s > 0:
        raise ValueError(f"The arrival rate must be positive (got {rate_per_s}).")
    rng = random.Random(seed)
    now_s, out = 0.0, []
    for spec in specs:
        now_s += rng.expovariate(rate_per_s)
        out.append(dataclasses.replace(spec, arrival_s=now_s))
    return out


def check_arrivals(specs: list[RequestSpec], max_arrival_s: float) -> list[RequestSpec]:
    """Raises ValueError: an arrival after ``max_arrival_s`` (engines wait in real time, holding the
    shared model)."""
    latest_s = max((s.arrival_s for s in specs), default=0.0)
    if latest_s > max_arrival_s:
        raise ValueError(
            f"The last request would arrive {latest_s:.0f} s after Run, but a run waits for "
            f"arrivals at most {max_arrival_s:g} s; raise the arrival rate or lower arrival_s."
        )
    return specs


def request_label(request_id: int) -> str:
    return f"Request R{request_id} (row {request_id + 1})"


def tokenize_requests(
    specs: list[RequestSpec], tokenizer, *, chat_template: bool, max_context: int
) -> list[Request]:
    """Tokenize specs once, identically for every engine and the reference; ``chat_template``: a
    one-turn user message with the generation prompt, else raw text (special tokens not special).
    Raises ValueError: a prompt plus its cap that does not fit in ``max_context`` tokens."""
    requests = []
    for request_id, spec in enumerate(specs):
        ids = _encode(spec.prompt, tokenizer, chat_template)
        where = request_label(request_id)
        if not ids:
            raise ValueError(f"{where}: the prompt has no tokens.")
        if len(ids) + spec.max_new_tokens > max_context:
            raise ValueError(
                f"{where}: prompt ({len(ids)} tokens) + max_new_tokens ({spec.max_new_tokens}) "
                f"exceeds the model's context of {max_context} tokens; shorten it."
            )
        request = Request(
            request_id, spec.prompt, spec.max_new_tokens, tuple(ids), spec.arrival_s, spec.sampling
        )
        requests.append(request)
    return requests


def _encode(prompt: str, tokenizer, chat_template: bool) -> list[int]:
    if chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    # split_special_tokens: "<|im_end|>" typed in a prompt is text, never the EOS id itself.
    return list(tokenizer(prompt, add_special_tokens=True, split_special_tokens=True)["input_ids"])


def _text(value, where: str, what: str) -> str:
    """A cell as text. Raises ValueError: an int too long to print (over 4,300 digits)."""
    try:
        return str(value)
    except ValueError:  # Python's int-to-str digit limit
        raise ValueError(f"{where}: {what} is a number too long to read.") from None


def checked_count(specs: list[RequestSpec]) -> list[RequestSpec]:
    """Raises ValueError: no specs, or over the row limit."""
    if not specs:
        raise ValueError("The workload is empty: add at least one request with a prompt.")
    max_rows = limits().max_rows
    if len(specs) > max_rows:
        raise ValueError(f"{len(specs)} requests is over the limit of {max_rows} per run.")
    return specs
