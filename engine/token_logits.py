"""Per-token logit records: the top ``TOP_K`` logits, the hidden state's norm and a digest of the
whole row per output token (margins, a rounding bound and bitwise equality, not ``V`` floats).
``LogitRecorder`` is a forward hook on ``lm_head``, whatever engine called the model."""

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
    """One output position's logits in one run: the top ``TOP_K`` ``token_ids`` and ``logits``, best
    first; ``abs_dots[i] = sum_j |h_j| |W[token_ids[i], j]|``, the scale of that logit's rounding
    error; ``hidden_norm = ||h||_2``; ``digest`` of the row's bytes."""

    token_ids: tuple[int, ...]
    logits: tuple[float, ...]
    abs_dots: tuple[float, ...]
    hidden_norm: float
    digest: str

    def abs_dot_of(self, token_id: int) -> float | None:
        return self._of(self.abs_dots, token_id)

    def logit_of(self, token_id: int) -> float | None:
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
    """CRC-32 of a logits row's bytes ``[V]``, 8 hex digits: only bitwise equality is asked, and it
    costs a quarter of a cryptographic hash."""
    raw = logits.detach().contiguous().cpu().view(torch.uint8).numpy()
    return f"{zlib.crc32(raw):08x}"


class LogitTrail(Sequence):
    """One request's ``TokenLogits`` per output token, about 110 bytes a token instead of 800 as
    objects; ``trail[i]`` rebuilds the one appended."""

    def __init__(self, rows: Iterable[TokenLogits] = ()):
        self._k = 0
        self._ids, self._logits, self._abs = array("i"), array("f"), array("f")
        self._norms, self._digests = array("f"), bytearray()
        for row in rows:
            self.append(row)

    def append(self, row: TokenLogits) -> None:
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
    """``TokenLogits`` rows of every output-embedding call while installed: ``calls[i]`` per
    sequence or batch row. ``keep_call=i`` keeps that call's first row as ``kept = (hidden [d],
    logits [V], weight [V, d])``; ``skip_rows``: rows left unrecorded (None), whose tokens are
    dropped."""

    def __init__(self, top_k: int = TOP_K, keep_call: int | None = None):
        self.top_k = top_k
        self.keep_call = keep_call
        self.calls: list[list[TokenLogits | None]] = []
        self.kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.skip_rows: frozenset[int] = frozenset()

    def hook(self, module, inputs, output) -> None:
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
        assert self.calls, "no model call was recorded"
        return self.calls.pop()


def logit_and_abs_dot(kept, token_id: int) -> tuple[float, float]:
    hidden, logits, weight = kept
    abs_dot = (hidden.float().abs() * weight[token_id].detach().float().abs()).sum()
    return float(logits[token_id]), float(abs_dot)


@contextlib.contextmanager
def recording(model, recorder: LogitRecorder) -> Iterator[LogitRecorder]:
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
