"""manifest.json: what a companion bundle holds and how to check it.

Format version, model and tokenizer identity, vocabulary hash, the target family
the draft pairs with (and its base identity), context length, the edge-cloud section
(wire version, codec, device profile with K*'s parameters), the I/O names of each artefact, `files`
(relative path -> sha256 and size, every file of the bundle), and the parity
figures of each conversion.
"""

from __future__ import annotations

import json
from pathlib import Path

from apps.companion.identity import sha256_file

FORMAT = "duet-companion-bundle"
FORMAT_VERSION = 2  # 2: edge.json (wire, codec, HELLO claim) and the device profile
MANIFEST = "manifest.json"


def file_table(bundle: Path) -> dict[str, dict]:
    """Every file under `bundle` (but the manifest): posix relative path -> sha256 and size."""
    table = {}
    for f in sorted(bundle.rglob("*")):
        if f.is_file() and f.name != MANIFEST:
            table[f.relative_to(bundle).as_posix()] = {
                "sha256": sha256_file(f),
                "size": f.stat().st_size,
            }
    return table


def write_manifest(bundle: Path, body: dict) -> dict:
    """Add format, version and the file table to `body`; write it as manifest.json."""
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **body,
        "files": file_table(bundle),
    }
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
