"""Content identities a bundle records: file digests, and (from runtime/edge/identity.py, where
the verifier computes the same) the vocabulary hash and base identity a target must share for
the draft's proposals to mean anything to it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from runtime.edge.identity import base_identity, vocab_hash

__all__ = ["CHUNK", "base_identity", "sha256_file", "vocab_hash"]

CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
