"""Payload codecs of the VERIFY frame: one module each, found through one table (STYLE 12).

A codec module exposes
  NAME: str, NUMBER: int (the u8 in the VERIFY frame), CARRIES_Q: bool,
  encode(tokens: list[int], q: np.ndarray | None, vocab: int) -> bytes,
  decode(body: bytes, vocab: int) -> Draft   (raises wire.ProtocolError on a malformed body).
Optionally `params(vocab) -> dict`: the codec's parameters, which a companion bundle records
beside its name (apps/companion/edge_side.py; {} without it). A codec without q can only be
verified greedily (T = 0). A lossy codec (SQS-SD, CU-HLM) adds `draft_law(q) -> q_hat`: the
client must sample its draft tokens from q_hat, the law the server reconstructs, so that
rejection sampling stays lossless. Adding a codec is one module and one line in CODEC_MODULES.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from runtime.edge.wire import E_CODEC, ProtocolError

CODEC_MODULES: dict[str, str] = {
    "ids": "runtime.edge.codecs.ids",
    "raw": "runtime.edge.codecs.raw",
}


@dataclass
class Draft:
    """A decoded window: the draft tokens and, when the codec carries it, q (K, V) float32."""

    tokens: list[int]
    q: np.ndarray | None


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
