"""Who may talk to whom: the identity a draft claims at HELLO and the verifier's check of it.

A claim (HELLO's optional extension, PROTOCOL.md) says which wire version and codec the edge
will speak, the vocabulary hash of the draft's tokenizer, and, when known, the base checkpoint
the draft was built to pair with (family, name, hash of its config.json). The verifier holds
the same facts about its own target (`target_identity`) and refuses a claim it cannot honour
with the ERROR code that names the mismatch. This module computes and compares; it does no I/O
beyond reading the checkpoint's JSON files, and knows nothing of bundles or sockets.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from runtime.edge import wire
from runtime.edge.wire import ProtocolError

# config.json keys that name the exporting software, not the checkpoint
VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")


def vocab_hash(tokenizer_json: str | Path) -> str:
    """sha256 over the (id, token) pairs of the vocabulary and added tokens, in id order.

    Independent of formatting and merges: two tokenizers with the same ids for the same
    strings get the same hash, so a target can be checked against the draft's bundle.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    pairs = sorted(((i, t) for t, i in tok.get_vocab(with_added_tokens=True).items()))
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


def base_identity(checkpoint: str | Path) -> dict:
    """{family, name, config_sha256} of a checkpoint directory: sha256 of its config.json as
    canonical JSON (sorted keys, without the keys that only name the exporting software)."""
    d = Path(checkpoint)
    cfg = json.loads((d / "config.json").read_text())
    body = {k: v for k, v in cfg.items() if k not in VOLATILE_CONFIG_KEYS}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {"family": cfg.get("model_type"), "name": d.resolve().name, "config_sha256": digest}


def target_identity(checkpoint: str | Path) -> dict:
    """What a verifier knows of its target: {vocab_hash (None without tokenizer.json), base}."""
    d = Path(checkpoint)
    tok = d / "tokenizer.json"
    return {"vocab_hash": vocab_hash(tok) if tok.is_file() else None, "base": base_identity(d)}


def check_claim(claim: dict, identity: dict | None, vocab_size: int, codecs) -> None:
    """Refuse a HELLO claim this verifier cannot verify: ProtocolError with E_VERSION (wire
    version), E_CODEC (codec), E_VOCAB (vocabulary size or hash) or E_IDENTITY (base)."""
    if not isinstance(claim, dict):
        raise ProtocolError(wire.E_MALFORMED, "HELLO: the claim must be a JSON object")
    if claim.get("wire_version") != wire.VERSION:
        raise ProtocolError(
            wire.E_VERSION,
            f"the bundle speaks wire version "
            f"{claim.get('wire_version')!r}; this verifier speaks {wire.VERSION}",
        )
    if claim.get("codec") not in codecs:
        raise ProtocolError(
            wire.E_CODEC,
            f"the bundle's codec {claim.get('codec')!r} is not one "
            f"this verifier decodes ({', '.join(codecs)})",
        )
    if claim.get("vocab_size") != vocab_size:
        raise ProtocolError(
            wire.E_VOCAB,
            f"the bundle's draft has a vocabulary of "
            f"{claim.get('vocab_size')!r}; this verifier's target has {vocab_size}",
        )
    mine = (identity or {}).get("vocab_hash")
    if mine is None:
        raise ProtocolError(
            wire.E_VOCAB,
            "this verifier knows no tokenizer for its target, so "
            "it cannot check the bundle's vocabulary",
        )
    if claim.get("vocab_hash") != mine:
        raise ProtocolError(
            wire.E_VOCAB,
            f"the bundle's vocabulary "
            f"{str(claim.get('vocab_hash'))[:12]} is not this verifier's "
            f"({mine[:12]}); the draft's tokens would mean other strings",
        )
    base, have = claim.get("base"), identity.get("base")
    if base is not None and (
        not isinstance(base, dict)
        or have is None
        or base.get("config_sha256") != have.get("config_sha256")
    ):
        want = base.get("name") if isinstance(base, dict) else base
        raise ProtocolError(
            wire.E_IDENTITY,
            f"the bundle's draft was built for base {want!r}; "
            f"this verifier serves {(have or {}).get('name')!r} (another "
            "config.json)",
        )
