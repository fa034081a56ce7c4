"""Per-token logit records: what a run's logits looked like at each token it generated.

Every run (the reference, the static engine, the continuous engine) keeps, for each output token,
a ``TokenLogits``: the top ``TOP_K`` logits with their token ids, the norm of the hidden state that
produced them, and a digest of the whole logits row. That is enough to explain a difference
between two runs after the fact (``engine.fidelity.divergence``) without keeping ``V`` floats per
token:

* the top ``TOP_K`` give the margin between the chosen token and its rivals, in the run's own pass
  (not in some re-run of the prefix through another kernel);
* ``hidden_norm`` and the output embedding's row norms bound the rounding error of a logit;
* ``digest`` tells whether two runs' logits rows were bitwise equal, the proof of the
  batch-invariant mode.

``LogitRecorder`` is a forward hook on the model's output embedding (``lm_head``): its input rows
are the final hidden states and its output rows the logits, whatever engine called the model. Each
call of the model adds one list of rows (one per sequence the call computed logits for).
"""

from __future__ import annotations

import contextlib
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

TOP_K = 8  # logits kept per output token; the divergence view shows the first 5
DIGEST_BYTES = 4  # a logits row's digest: its CRC-32


@dataclass(frozen=True)
class TokenLogits:
    """One output position's logits in one run.

    ``token_ids`` and ``logits`` are the top ``TOP_K``, best first (the model's dtype values, as
    float). ``abs_dots[i]`` is ``sum_j |h_j| |W[token_ids[i], j]|`` for the final hidden state ``h``
    and the output embedding ``W``: the scale of that logit's rounding error
    (``engine.fidelity.divergence``). ``hidden_norm`` is ``||h||_2``; ``digest`` a hash of the whole
    logits row's bytes (equal digests: bitwise equal rows).
    """

    token_ids: tuple[int, ...]
    logits: tuple[float, ...]
    abs_dots: tuple[float, ...]
    hidden_norm: float
    digest: str

    def abs_dot_of(self, token_id: int) -> float | None:
        """``abs_dots`` of ``token_id``, or None when it is not among the top ``TOP_K``."""
        return self._of(self.abs_dots, token_id)

    def logit_of(self, token_id: int) -> float | None:
        """The logit of ``token_id``, or None when it is not among the top ``TOP_K``."""
        return self._of(self.logits, token_id)

    def _of(self, values: tuple[float, ...], token_id: int) -> float | None:
        return values[self.token_ids.index(token_id)] if token_id in self.token_ids else None


def token_logits_rows(
    hidden: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor, top_k: int = TOP_K
) -> list[TokenLogits]:
    """A ``TokenLogits`` per row, for ``logits = hidden @ weight.T`` (+ a bias, if any).

    Shapes:
        hidden: [R, d] (final hidden states);  logits: [R, V];  weight: [V, d]  ->  R records
    """
    rows = logits.detach()  # (R, V) in the model's dtype
    values, ids = rows.topk(min(top_k, rows.shape[-1]), dim=-1)  # (R, K)
    h = hidden.detach().float()  # (R, d)
    abs_w = weight.detach()[ids].float().abs()  # (R, K, d)
    abs_dots = (h.abs()[:, None, :] * abs_w).sum(dim=-1)  # (R, K)
    return [
        TokenLogits(tuple(i), tuple(v), tuple(a), n, row_digest(row))
        for i, v, a, n, row in zip(
            ids.tolist(),
            values.float().tolist(),
            abs_dots.tolist(),
            h.norm(dim=-1).tolist(),
            rows,
            strict=True,
        )
    ]


def row_digest(logits: torch.Tensor) -> str:
    """``TokenLogits.digest``: the CRC-32 of one logits row's bytes ``[V]`` in its own dtype, as
    8 hex digits. It only tells whether two runs' rows are bitwise equal, so a checksum does; at a
    few GB/s it costs a quarter of a cryptographic hash's time (a row of 49,152 float32 logits is
    192 KiB, and a step of 8 sequences digests 8 of them)."""
    raw = logits.detach().contiguous().cpu().view(torch.uint8).numpy()
    return f"{zlib.crc32(raw):08x}"


class LogitTrail(Sequence):
    """One run's ``TokenLogits`` for each output token of one request, stored compactly.

    A ``TokenLogits`` as Python objects takes about 800 bytes; here a token takes about 110
    (float32 and int32 arrays, 4-byte digests), so long runs on a public page stay small. Reading
    ``trail[i]`` builds the ``TokenLogits`` again, equal to the one appended.
    """

    def __init__(self, rows: Iterable[TokenLogits] = ()):
        self._k = 0
        self._ids, self._logits, self._abs = array("i"), array("f"), array("f")
        self._norms, self._digests = array("f"), bytearray()
        for row in rows:
            self.append(row)

    def append(self, row: TokenLogits) -> None:
        """Add the record of the next output token (all rows have the same top ``K``)."""
        if not self._norms:
            self._k = len(row.token_ids)
        assert len(row.token_ids) == self._k, "rows of one trail keep the same number of logits"
        self._ids.extend(row.token_ids)
        self._logits.extend(row.logits)
        self._abs.extend(row.abs_dots)
        self._norms.append(row.hidden_norm)
        self._digests += bytes.fromhex(row.digest)

    def __len__(self) -> int:
        return len(self._norms)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("trail index out of range")
        a, b = index * self._k, (index + 1) * self._k
        digest = self._digests[index * DIGEST_BYTES : (index + 1) * DIGEST_BYTES].hex()
        return TokenLogits(
            tuple(self._ids[a:b]),
            tuple(self._logits[a:b]),
            tuple(self._abs[a:b]),
            self._norms[index],
            digest,
        )


class LogitRecorder:
    """Collects ``TokenLogits`` rows of every output-embedding call while installed.

    ``calls[i]`` holds the rows of the i-th model call: one per sequence (packed engine) or per
    batch row (``model.generate``, one call per generated token). ``keep_call=i`` also keeps that
    call's whole first row: ``kept = (hidden [d], logits [V], weight [V, d])``, for a logit outside
    the top ``TOP_K`` (``logit_and_abs_dot``). ``skip_rows``: row indices the next calls leave
    unrecorded (None in their place), for rows whose tokens are dropped (a static wave's finished
    rows and its padding): their top-k and digest cost as much as a kept row's.
    """

    def __init__(self, top_k: int = TOP_K, keep_call: int | None = None):
        self.top_k = top_k
        self.keep_call = keep_call
        self.calls: list[list[TokenLogits | None]] = []
        self.kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.skip_rows: frozenset[int] = frozenset()

    def hook(self, module, inputs, output) -> None:
        """``register_forward_hook`` callback: record the rows of one call."""
        hidden = inputs[0].reshape(-1, inputs[0].shape[-1])  # (R, d)
        logits = output.reshape(-1, output.shape[-1])  # (R, V)
        if len(self.calls) == self.keep_call:
            self.kept = (hidden[0].detach().clone(), logits[0].detach().clone(), module.weight)
        if not self.skip_rows:
            self.calls.append(token_logits_rows(hidden, logits, module.weight, self.top_k))
            return
        keep = [r for r in range(len(logits)) if r not in self.skip_rows]
        rows = iter(token_logits_rows(hidden[keep], logits[keep], module.weight, self.top_k))
        self.calls.append([next(rows) if r in keep else None for r in range(len(logits))])

    def pop(self) -> list[TokenLogits]:
        """The rows of the latest call, removed from the recorder."""
        assert self.calls, "no model call was recorded"
        return self.calls.pop()


def logit_and_abs_dot(kept, token_id: int) -> tuple[float, float]:
    """From ``LogitRecorder.kept``: the logit of ``token_id`` and its ``abs_dot``."""
    hidden, logits, weight = kept
    abs_dot = (hidden.float().abs() * weight[token_id].detach().float().abs()).sum()
    return float(logits[token_id]), float(abs_dot)


@contextlib.contextmanager
def recording(model, recorder: LogitRecorder) -> Iterator[LogitRecorder]:
    """Within the block, every call of ``model`` adds its rows to ``recorder``."""
    handle = model.get_output_embeddings().register_forward_hook(recorder.hook)
    try:
        yield recorder
    finally:
        handle.remove()


def same_logits(a: Sequence[TokenLogits] | None, b: Sequence[TokenLogits] | None) -> bool | None:
    """Whether two runs' logits were bitwise equal at every position both have (None: unknown)."""
    if not a or not b:
        return None
    return len(a) == len(b) and all(x.digest == y.digest for x, y in zip(a, b, strict=True))
