"""Payload codecs of the VERIFY frame: one module each, found through one table (STYLE 12).

A codec module exposes
  NAME: str, NUMBER: int (the u8 in the VERIFY frame), CARRIES_Q: bool,
  encode(tokens: list[int], q: np.ndarray | None, vocab: int) -> bytes,
  decode(body: bytes, vocab: int) -> Draft   (raises wire.ProtocolError on a malformed body).
Optionally `params(vocab) -> dict`: the codec's parameters, which a companion bundle records
beside its name (apps/companion/edge_side.py; {} without it), and `FIXED_ROWS = True` where
every draft token costs the same bits whatever q is (ids, raw): the edge loop then gives K*
that row size as a prior before round one (runtime/edge/loop.py). A codec without q can only be
verified greedily (T = 0). A compressed-q codec (k-sqs, c-sqs,
cu-hlm) instead exposes `encoder(vocab, **params)`, a per-session object whose
`draft_law(q) -> q_hat` the edge loop calls for every draft token (the token is then drawn from
q_hat with a fresh uniform: the law the server reconstructs, so rejection sampling stays
lossless, SQS §2), whose `encode(tokens, q_hat, vocab)` sends the rows it quantized, and whose
`verdict(accepted, drafted)` follows each round (C-SQS's Alg. 1). `new_encoder` gives every
codec that shape. Adding a codec is one module and one line in CODEC_MODULES.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from runtime.edge.wire import E_CODEC, ProtocolError

CODEC_MODULES: dict[str, str] = {
    "ids": "runtime.edge.codecs.ids",
    "raw": "runtime.edge.codecs.raw",
    "k-sqs": "runtime.edge.codecs.k_sqs",
    "c-sqs": "runtime.edge.codecs.c_sqs",
    "cu-hlm": "runtime.edge.codecs.cu_hlm",
}


@dataclass
class Draft:
    """A decoded window: the draft tokens and, when the codec carries it, q (K, V) float32 or
    rows left coded (k-sqs, c-sqs: `token_probs` and `row(i)`, runtime/edge/codecs/lossy.py);
    `forced` (K,) bool marks rows the edge skipped (CU-HLM eq. 10: commit unverified), or None."""

    tokens: list[int]
    q: np.ndarray | None
    forced: list[bool] | None = None


def codec(name: str):
    """The codec module called `name`."""
    from runtime.errors import DuetError

    if name not in CODEC_MODULES:
        raise DuetError(f"unknown codec {name!r}; choose from {', '.join(CODEC_MODULES)}")
    return importlib.import_module(CODEC_MODULES[name])


def by_number() -> dict[int, object]:
    """Every codec module keyed by its wire number."""
    mods = [importlib.import_module(m) for m in CODEC_MODULES.values()]
    table = {m.NUMBER: m for m in mods}
    assert len(table) == len(mods), "two codecs share a wire number"
    return table


def codec_for_number(n: int):
    """The codec module with wire number `n`, or a ProtocolError naming it."""
    table = by_number()
    if n not in table:
        raise ProtocolError(E_CODEC, f"unknown codec number {n}")
    return table[n]


class PlainEncoder:
    """The encoder shape for a codec that sends q as drawn (raw: draft_law is the identity, so
    a greedy window still gets softmax rows) or nothing (ids: no draft_law)."""

    last_bits = None

    def __init__(self, mod):
        self.mod = mod
        self.draft_law = (lambda q: q) if mod.CARRIES_Q else None

    def encode(self, tokens, q, vocab: int) -> bytes:
        return self.mod.encode(tokens, q if self.mod.CARRIES_Q else None, vocab)

    def verdict(self, accepted: int, drafted: int) -> None:
        pass


def new_encoder(mod, vocab: int, params: dict | None = None):
    """A session's encoder for codec module `mod`; DuetError for parameters it does not take."""
    from runtime.errors import DuetError

    if not hasattr(mod, "encoder"):
        if params:
            raise DuetError(f"codec {mod.NAME} takes no parameters (got {', '.join(params)})")
        return PlainEncoder(mod)
    try:
        return mod.encoder(vocab, **(params or {}))
    except (TypeError, ValueError) as e:
        raise DuetError(f"codec {mod.NAME}: {e}") from None
