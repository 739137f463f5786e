"""The shared edge/cloud wrapper of the compressed-q codecs (k-sqs, c-sqs, cu-hlm): a per-session
`Encoder` around a kernels/payloads.py codec, and the server-side `decode_payload`.

The coding itself lives in kernels/ (payload_sqs.py, payload_cuhlm.py); this module only
keeps the rows quantized while drafting (`draft_law`), turns them into the VERIFY body, passes
the verdict back (C-SQS's Alg. 1 backtrack) and maps MalformedPayload to an E_MALFORMED
ProtocolError. The body of these codecs is the kernel payload, unchanged (its own header names
the codec, V, L and the exact body bit length). The edge draws each draft token from the decoded
q̂ (`draft_law`) and the server verifies with that same q̂, so the target's law is kept exactly
(SQS §2). `lossy_codec` gives each codec module its `encoder` and `decode`.
"""

from __future__ import annotations

import numpy as np

from kernels import payload_sqs
from kernels.bitio import MalformedPayload
from kernels.payloads import decode_rows, make_codec
from kernels.sqs import theorem2_bound
from runtime.edge.codecs import Draft
from runtime.edge.wire import E_MALFORMED, ProtocolError

MAX_ROWS = 128  # rows one body may carry: q̂ is dense (L × V floats) on the server


class Encoder:
    """One session's coder: `draft_law(q)` quantizes a draft distribution and returns the q̂ the
    token must be drawn from (SQS §2); `encode` sends the window's rows; `verdict` follows it."""

    def __init__(self, name: str, vocab: int, **params):
        self.kernel = make_codec(name, **params)
        self.vocab = vocab
        self.rows: list = []
        self.last_bits = 0  # eq. (1) model of the last body: header + body bits (before padding)
        self.budget: int | None = None  # SQS §4's per-batch bit budget B on the body (None: off)
        self.spent = 0  # body bits of the rows drafted since the last `encode`

    def draft_law(self, q: np.ndarray) -> np.ndarray | None:
        """q̂ of one draft distribution (the row is kept for `encode`); None when the row would
        push the batch's body bits over `budget`: the batch ends before it (nothing is drawn)."""
        row = self.kernel.quantize(np.asarray(q, np.float32)[None])[0]
        if self.budget is not None:
            bits = self.kernel.body_bits([row], self.vocab)  # the row's bits on the wire
            if self.spent + bits > self.budget:  # SQS §4: L^t = max{L : sum_n b_n <= B}, in order
                th = getattr(self.kernel, "threshold", None)
                if th is not None:
                    th.undo()  # C-SQS: the row is not sent, so its eq. (8) update is not made
                return None
            self.spent += bits
        self.rows.append(row)
        return self.kernel.qhat([row], self.vocab)[0]

    def skip_last(self) -> None:
        """The last row's token is committed unverified (CU-HLM eq. 10): send its id alone."""
        if self.kernel.name != "cu-hlm":
            raise ValueError("only cu-hlm rows can be skipped (CU-HLM eq. 10)")
        self.rows[-1] = None

    def encode(self, tokens, q_hat, vocab: int) -> bytes:
        """The VERIFY body of the rows drafted since the last call (one per token)."""
        rows, self.rows, self.spent = self.rows, [], 0
        if len(rows) != len(tokens):
            raise ValueError(
                f"{len(tokens)} tokens but {len(rows)} quantized rows: draw every "
                "token through draft_law"
            )
        self.last_bits = 8 * self.kernel.header_bytes() + self.kernel.body_bits(rows, vocab)
        return self.kernel.encode(rows, np.asarray(tokens, np.int64), vocab)

    def verdict(self, accepted: int, drafted: int) -> None:
        """The cloud accepted `accepted` of `drafted`: C-SQS backtracks its threshold (Alg. 1)."""
        th = getattr(self.kernel, "threshold", None)
        if th is not None and drafted:
            th.verdict(accepted)  # Alg. 1 lines 11-13

    def stats(self) -> dict | None:
        """C-SQS: beta now, the mean dropped mass over kept tokens (eq. 7's left side) and
        Theorem 2's bound on it (eq. 9); None for the other codecs."""
        th = getattr(self.kernel, "threshold", None)
        if th is None or not th.kept:
            return None
        mean = th.dropped_sum / th.kept
        bound = theorem2_bound(th.alpha, th.eta, th.beta1, th.kept)  # eq. (9)
        return {
            "beta": th.beta,
            "kept": th.kept,
            "mean_dropped": mean,
            "theorem2_bound": bound,
            "theorem2_met": mean <= bound,
        }


class _Rows:
    """An SQS payload's rows left coded (kernels/payload_sqs.CodedRows) for the verifier: a row
    found inconsistent when rejection sampling unranks it is an E_MALFORMED ProtocolError."""

    def __init__(self, coded: payload_sqs.CodedRows, name: str):
        self.coded, self.name = coded, name
        self.token_probs = coded.token_probs

    def row(self, i: int) -> np.ndarray:
        try:
            return self.coded.row(i)
        except MalformedPayload as e:
            raise ProtocolError(E_MALFORMED, f"{self.name} payload: {e}") from None


def decode_payload(body: bytes, vocab: int, codec_byte: int, name: str) -> Draft:
    """Tokens and q̂ of a kernel payload; E_MALFORMED for any inconsistency (MalformedPayload).
    K-SQS and C-SQS rows stay coded (`_Rows`): the verifier unranks only the row it rejects at."""
    if not body or body[0] != codec_byte:
        raise ProtocolError(E_MALFORMED, f"{name} payload: first byte is not its codec byte")
    if codec_byte in (payload_sqs.K_SQS, payload_sqs.C_SQS):
        try:
            tokens, coded = payload_sqs.decode_lazy(body, vocab, MAX_ROWS)
        except MalformedPayload as e:
            raise ProtocolError(E_MALFORMED, f"{name} payload: {e}") from None
        return Draft([int(t) for t in tokens], _Rows(coded, name))
    try:
        tokens, q_hat, rows = decode_rows(body, vocab, MAX_ROWS)
    except MalformedPayload as e:
        raise ProtocolError(E_MALFORMED, f"{name} payload: {e}") from None
    forced = [r is None for r in rows]
    return Draft([int(t) for t in tokens], q_hat, forced if any(forced) else None)


def lossy_codec(name: str, codec_byte: int, defaults: dict):
    """The `encoder` and `decode` of the codec module `name` whose payloads start with
    `codec_byte` (kernels/payloads.py), its parameters defaulting to `defaults`."""

    def encoder(vocab: int, **params) -> Encoder:
        """A session's coder with these parameters (DEFAULTS for the rest)."""
        return Encoder(name, vocab, **{**defaults, **params})

    def decode(body: bytes, vocab: int) -> Draft:
        """Tokens and q̂; ProtocolError(E_MALFORMED) on anything the kernel decoder refuses."""
        return decode_payload(body, vocab, codec_byte, name)

    return encoder, decode
