"""A conversation's next prompt as the ids the caches hold plus the tokens of what is new.

A chat template renders earlier answers as *text*, and a sampled answer need not re-tokenize
to the ids that were generated: tokenizing the whole rendering again breaks the caches' prefix
at the first such token, and every later turn prefills the earlier answers again. `splice`
keeps the longest run of the held ids whose text starts the new rendering and tokenizes only
the rest (the template's own tokens around the new message, and the message). It is kept only
when its ids decode to exactly the rendered text and reuse more than the plain tokenization's
common prefix would; otherwise that tokenization serves, and `how` says why. runtime.chat
(chat_session.py) and apps.server (engine.py) both build their prompts through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.decoding.events import common_prefix

SPLICED = "spliced"  # the held ids, then the new text's own tokens
PREFIX = "prefix"  # the plain tokenization reuses as much (a new conversation, a greedy echo)
MISMATCH = "mismatch"  # the spliced ids decode to other text: this tokenizer cannot be spliced


@dataclass
class Splice:
    """The prompt's ids, how many leading ones the held sequence shares, and how they came."""

    ids: list[int]
    kept: int
    how: str


class TextCodec:
    """encode/decode of a runtime.tokenizer.Tokenizer, without the post-processor's specials
    (a BOS added to the tail would land mid-sequence), as a splice needs them."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return self.tok.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def covered(held: list[int], text: str, decode) -> int:
    """How many leading ids of `held` decode to a prefix of `text` (the most, by bisection)."""
    if text.startswith(decode(held)):
        return len(held)
    lo, hi = 0, len(held)  # held[:lo] is covered, held[:hi] is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text.startswith(decode(held[:mid])):
            lo = mid
        else:
            hi = mid
    return lo


def splice(held: list[int], text: str, codec, plain: list[int] | None = None) -> Splice:
    """The ids of `text` for caches that hold `held`: `codec` has encode(text) and decode(ids)
    (a ChatTemplate, a TextCodec); `plain` is `text`'s own tokenization when already made."""
    plain = codec.encode(text) if plain is None else plain
    shared = common_prefix(held, plain)
    k = covered(held, text, codec.decode)
    if k <= shared:
        return Splice(plain, shared, PREFIX)
    ids = held[:k] + codec.encode(text[len(codec.decode(held[:k])) :])
    if codec.decode(ids) != text:
        return Splice(plain, shared, MISMATCH)
    return Splice(ids, k, SPLICED)
