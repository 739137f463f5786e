"""What a companion bundle carries for the edge-cloud protocol, and reading it back.

At `package` time: the device profile (a shipped name or a calibrated .toml/.json, copied
byte for byte as profile.toml / profile.json) with the FlexSpec latency parameters K* needs
(eq. (10)-(11): alpha_edge, beta, t_base, delta_cloud), and edge.json: the wire-format version,
the codec (any name in runtime/edge/codecs CODEC_MODULES) with its parameters, and the claim
the client presents at HELLO (vocabulary hash, base identity). The manifest hashes both files
like every other. At `run` time: the same facts, read only from the verified bundle. It does
no networking (apps/companion/cloud_client.py) and no conversion (package.py).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import DuetError

EDGE_FILE = "edge.json"
FLEXSPEC_KEYS = ("alpha_edge", "beta", "delta_cloud", "t_base")  # FlexSpecParams' order


def codec_record(name: str, vocab: int) -> dict:
    """{name, number, carries_q, lossy, params} of the codec `name` for a vocabulary of `vocab`."""
    from runtime.edge.codecs import codec

    mod = codec(name)
    params = mod.params(vocab) if hasattr(mod, "params") else dict(getattr(mod, "DEFAULTS", {}))
    # a compressed-q codec (k-sqs, c-sqs, cu-hlm) has a per-session encoder whose q̂ the draft
    # samples from; the bundle records the parameters that encoder is built with
    return {
        "name": mod.NAME,
        "number": mod.NUMBER,
        "carries_q": bool(mod.CARRIES_Q),
        "lossy": hasattr(mod, "encoder"),
        "params": params,
    }


def load_k_profile(profile_arg: str):
    """The device profile `profile_arg` (shipped name or file); DuetError when it lacks a
    parameter K* needs. Called before any conversion, so a bad name costs nothing."""
    from devices.profile import load_profile

    prof = load_profile(profile_arg)
    missing = [k for k in FLEXSPEC_KEYS if k not in prof.latency]
    if missing:
        raise DuetError(
            f"profile {prof.name!r} has no {', '.join(missing)} in [latency]; K* "
            "(FlexSpec eq. (11)) needs them: calibrate it (python -m devices "
            "calibrate) or pick another"
        )
    return prof


def profile_record(prof, staging: Path) -> dict:
    """Copy the profile's file into `staging`; its manifest entry (file, name, placement,
    FlexSpec parameters in seconds)."""
    fname = "profile" + (prof.path.suffix if prof.path.suffix == ".json" else ".toml")
    shutil.copyfile(prof.path, staging / fname)
    return {
        "file": fname,
        "name": prof.name,
        "source": prof.path.name,
        "draft": {
            "accelerator": prof.draft.accelerator,
            "backend": prof.draft.backend,
            "provider": prof.draft.provider,
        },
        "flexspec": {k: prof.param(k) for k in FLEXSPEC_KEYS},  # seconds
    }


def write_edge(
    staging: Path, *, codec: str, vocab: int, vocab_hash: str, base: dict | None, profile=None
) -> dict:
    """Write edge.json (and `profile`, from load_k_profile) into `staging`; returns the
    manifest's `edge` section."""
    from runtime.edge import wire

    edge = {
        "file": EDGE_FILE,
        "protocol": "runtime/edge/PROTOCOL.md",
        "wire_version": wire.VERSION,
        "codec": codec_record(codec, vocab),
        "claim": {
            "wire_version": wire.VERSION,
            "codec": codec,
            "vocab_size": vocab,
            "vocab_hash": vocab_hash,
            "base": base,
        },
        "profile": profile_record(profile, staging) if profile else None,
    }
    (staging / EDGE_FILE).write_text(json.dumps(edge, indent=2, sort_keys=True) + "\n")
    return edge


@dataclass
class EdgeSide:
    """The edge-cloud facts of a verified bundle."""

    codec: str
    codec_params: dict  # a compressed-q codec's parameters, as packaged
    claim: dict  # sent at HELLO
    flexspec: object | None  # devices.latency.FlexSpecParams, None without a profile
    profile_name: str | None


def read_edge(bundle: Path, manifest: dict) -> EdgeSide:
    """Read edge.json and the profile of a bundle that `verify_bundle` has checked."""
    from devices.latency import FlexSpecParams
    from devices.profile import read_profile_file
    from runtime.edge import wire

    if EDGE_FILE not in manifest["files"]:
        raise DuetError(
            f"{bundle}: the bundle has no {EDGE_FILE}; package it again to talk to a cloud verifier"
        )
    try:
        edge = json.loads((bundle / EDGE_FILE).read_text())
        codec, claim = edge["codec"]["name"], edge["claim"]
        # only a compressed-q codec's encoder takes parameters (ids/raw record theirs for the app)
        codec_params = dict(edge["codec"].get("params") or {}) if edge["codec"].get("lossy") else {}
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DuetError(f"{bundle / EDGE_FILE}: unreadable ({e})") from None
    if edge.get("wire_version") != wire.VERSION:
        raise DuetError(
            f"{bundle}: built for wire version {edge.get('wire_version')!r}; this "
            f"client speaks {wire.VERSION}"
        )
    params, name = None, None
    if edge.get("profile"):
        prof = read_profile_file(bundle / edge["profile"]["file"])
        params = FlexSpecParams(*(prof.param(k) for k in FLEXSPEC_KEYS))
        name = prof.name
    return EdgeSide(codec, codec_params, claim, params, name)
