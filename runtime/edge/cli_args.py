"""The flags of `--method flexspec` (shared by runtime.generate, runtime.chat, apps.bench) and
the command-layer code that turns them into a connected client: a `--server local` verifier
subprocess or HOST:PORT with a token, the link emulator and the K* controller (both from
devices/, built here in the command layer and passed down into the method's options).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from runtime.errors import DuetError


def add_edge_args(ap: argparse.ArgumentParser) -> None:
    """--server, --token-file, --link, --link-seed, --k, --k-max."""
    g = ap.add_argument_group("edge-cloud (--method flexspec)")
    g.add_argument("--server", default="local", metavar="HOST:PORT|local",
                   help="cloud verifier; local (default) starts one on 127.0.0.1 for --target")  # fmt: skip
    g.add_argument("--token-file", help="file with the verifier's shared secret")
    g.add_argument("--link", default="none",
                   help="emulated wireless link: none, 5g, 4g, wifi-weak (default none)")  # fmt: skip
    g.add_argument("--link-seed", type=int, default=0, help="seed of the link's fading (default 0)")
    g.add_argument(
        "--k", type=int, default=None, help="fixed draft length K (default: K* per round)"
    )
    g.add_argument("--k-max", type=int, default=8, help="bound on K* (default 8)")


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DuetError(f"--server must be HOST:PORT or local (got {text!r})")
    return host.strip("[]"), int(port)


def check_edge_args(a: argparse.Namespace) -> None:
    """One clear line for a bad --k, --k-max, --link or --server."""
    from devices.links import LINK_NAMES

    if a.k is not None and a.k < 0:
        raise DuetError(f"--k must be >= 0 (got {a.k})")
    if a.k_max < 1:
        raise DuetError(f"--k-max must be at least 1 (got {a.k_max})")
    if a.link not in LINK_NAMES:
        raise DuetError(f"unknown --link {a.link!r}; choose from {', '.join(LINK_NAMES)}")
    if a.server != "local":
        _host_port(a.server)


@contextlib.contextmanager
def edge_options(a: argparse.Namespace, target_dir, target_backend: str = "auto"):
    """Yield the flexspec options (conn, k, k_max, controller) for these flags; on exit close the
    connection and stop a local verifier."""
    from devices.kstar import AdaptiveK
    from devices.links import emulator
    from runtime.edge.client import Connection
    from runtime.edge.local import LocalVerifier

    check_edge_args(a)
    local = None
    try:
        if a.server == "local":
            local = LocalVerifier(target_dir, target_backend=target_backend)
            host, port, token = local.host, local.port, local.token
        else:
            host, port = _host_port(a.server)
            token = b""
            if a.token_file:
                p = Path(a.token_file)
                if not p.is_file():
                    raise DuetError(f"--token-file {a.token_file}: no such file")
                token = p.read_bytes().strip()
        conn = Connection(host, port, token, link=emulator(a.link, a.link_seed))
        try:
            yield {"conn": conn, "k": a.k, "k_max": a.k_max,
                   "controller": None if a.k is not None else AdaptiveK()}  # fmt: skip
        finally:
            conn.close()
    finally:
        if local is not None:
            local.stop()


def needs_local_target(a: argparse.Namespace) -> bool:
    """False when flexspec talks to a remote verifier and no --target was given: the edge then
    loads only the draft (the target may be far too large for this device)."""
    return not (getattr(a, "method", None) == "flexspec" and a.server != "local"
                and a.target is None and a.draft is not None)  # fmt: skip


def load_draft_only(a: argparse.Namespace):
    """A Pair whose `target` is the draft itself, used only for its config (vocabulary, context,
    EOS) and tokenizer; the verifier checks the vocabulary at HELLO."""
    from runtime.backends import backend_for_path, load_model
    from runtime.load import Pair, resolve
    from runtime.tokenizer import Tokenizer

    ddir = resolve(a.draft, "draft")
    db = a.draft_backend or (
        "onnx" if backend_for_path(ddir) in ("mlx", "onnx") else backend_for_path(ddir)
    )
    kw = {"intra_threads": a.draft_threads, "provider": a.provider} if db == "onnx" else {}
    d = load_model(ddir, db, **kw)
    tdir = ddir if ddir.is_dir() else ddir.parent
    tok = Tokenizer(tdir) if (tdir / "tokenizer.json").is_file() else None
    return Pair(d, d, tok, tdir, ddir, {"target_backend": "remote", "draft_backend": db})
