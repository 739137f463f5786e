"""Content identities a bundle records: file digests, and a vocabulary hash that a
target must share for the draft's proposals to mean anything to it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def vocab_hash(tokenizer_json: str | Path) -> str:
    """sha256 over the (token, id) pairs of the vocabulary and added tokens, in id order.

    Independent of formatting and merges: two tokenizers with the same ids for the same
    strings get the same hash, so a target can be checked against the draft's bundle.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    pairs = sorted(((i, t) for t, i in tok.get_vocab(with_added_tokens=True).items()))
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()
