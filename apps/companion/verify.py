"""Refuse a bundle that is not exactly what its manifest says, before anything is loaded.

Checks, in order: the manifest exists and parses, its format and version, the
artefacts the client needs are listed, every listed file exists with its size
and sha256, and no unlisted file sits among them. Each failure is one
DuetError line naming the file and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

from apps.companion.identity import sha256_file
from apps.companion.manifest import FORMAT, FORMAT_VERSION, MANIFEST
from runtime.errors import DuetError

REQUIRED = ("tokenizer.json", "draft.onnx", "draft.prefill.onnx", "edge.json")


def verify_bundle(bundle: str | Path) -> dict:
    """The manifest of a bundle whose every file checks out; DuetError otherwise."""
    b = Path(bundle)
    if not b.is_dir():
        raise DuetError(f"bundle not found: {b}")
    mpath = b / MANIFEST
    if not mpath.is_file():
        raise DuetError(f"{b}: incomplete bundle, no {MANIFEST}")
    try:
        m = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DuetError(f"{mpath}: corrupt manifest ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DuetError(f"{mpath}: not a Duet companion bundle manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise DuetError(
            f"{mpath}: bundle format version {m.get('format_version')!r}; "
            f"this client reads {FORMAT_VERSION}"
        )
    files = m.get("files")
    if not isinstance(files, dict):
        raise DuetError(f"{mpath}: manifest has no file table")
    for need in REQUIRED:
        if need not in files:
            raise DuetError(f"{b}: incomplete bundle, manifest lists no {need}")
    for rel, entry in files.items():
        p = b / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise DuetError(f"{mpath}: file path {rel!r} leaves the bundle")
        if not p.is_file():
            raise DuetError(f"{b}: incomplete bundle, {rel} is missing")
        size = p.stat().st_size
        if size != entry.get("size"):
            raise DuetError(
                f"{b}: {rel} is {size} bytes, manifest says {entry.get('size')} "
                "(truncated or replaced)"
            )
        if sha256_file(p) != entry.get("sha256"):
            raise DuetError(
                f"{b}: {rel} does not match its sha256 in the manifest (tampered or corrupt)"
            )
    listed = {(b / rel).resolve() for rel in files}
    for f in b.rglob("*"):
        if f.is_file() and f.name != MANIFEST and f.resolve() not in listed:
            raise DuetError(
                f"{b}: {f.relative_to(b).as_posix()} is not in the manifest (bundle was modified)"
            )
    return m
