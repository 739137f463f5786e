"""python -m apps.cloud serve: the cloud verifier.

    python -m apps.cloud serve [--target DIR] [--host 127.0.0.1] [--port 0] [--token-file F]
        [--max-sessions N] [--max-context N] [--idle-timeout S] [--max-frame BYTES]
        [--adapter [NAME=]DIR ...]

The first line on stdout is exactly `listening on HOST:PORT` (port 0 picks a free one). The
target defaults to the embedded one. Each `--adapter` (repeatable; NAME defaults to the
directory's name) is a LoRA adapter for the target, checked against it (one line and exit 2 for
another base) and held as a merged view sharing the backbone (runtime/adapter_views.py); a
session picks one by name at OPEN, or runs the base target. Per adapter, stderr says how many
bytes its view adds to the base's. Without --token-file any token is accepted, and the server
refuses to bind anything but a loopback address.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.cloud", __doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the verifier")
    s.add_argument("--target", help="target checkpoint directory (default: the embedded target)")
    s.add_argument("--target-backend", choices=["auto", "mlx", "torch", "onnx"], default="auto")
    s.add_argument("--target-threads", type=int, default=None, help="PyTorch threads")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    s.add_argument("--token-file", help="file holding the shared secret clients present at HELLO")
    s.add_argument("--max-sessions", type=int, default=64, help="open sessions at most (64)")
    s.add_argument("--max-context", type=int, default=None, help="tokens per session at most")
    s.add_argument("--idle-timeout", type=float, default=60.0, help="seconds (default 60)")
    s.add_argument("--max-frame", type=int, default=None, help="payload bytes at most (16 MiB)")
    s.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="LoRA adapter (PEFT format) a session may pick by NAME at OPEN "
        "(repeatable; NAME defaults to the directory's name)",
    )
    return ap


def read_token(path: str | None) -> bytes | None:
    """The secret in `path` (surrounding whitespace stripped), or None without a path."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise DuetError(f"--token-file {path}: no such file")
    tok = p.read_bytes().strip()
    if not tok:
        raise DuetError(f"--token-file {path}: the file is empty")
    if len(tok) > 1024:
        raise DuetError(f"--token-file {path}: a token is at most 1024 bytes")
    return tok


def load_target(target: str | None, backend: str, threads: int | None, adapters=()):
    """(target model (embedded by default) on `backend`, its identity for HELLO claims,
    {name: merged view} for `adapters`, the [NAME=]DIR specs of --adapter)."""
    from runtime.adapter import check_adapter
    from runtime.adapter_views import adapter_view, added_bytes, parse_adapter_spec, weight_bytes
    from runtime.edge.identity import target_identity
    from runtime.loading import load_pair, resolve

    specs = [parse_adapter_spec(s) for s in adapters]
    names = [n for n, _ in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DuetError(f"--adapter: the name {dup[0]!r} is given twice; name them NAME=DIR")
    if specs:  # refuse an adapter for another base before the (slow) model load
        from runtime.assets import default_pair

        base_dir = resolve(target, "target") if target is not None else default_pair()[0]
        for _, d in specs:
            check_adapter(d, base_dir)
    pair = load_pair(target, None, need_draft=False, target_backend=backend, target_threads=threads)
    views = {}
    for name, d in specs:
        views[name] = adapter_view(pair.target, pair.target_dir, d)
        print(
            f"adapter {name} ({d}): adds {added_bytes(views[name], pair.target) / 2**20:.1f} "
            f"MiB to the base's {weight_bytes(pair.target) / 2**20:.1f} MiB",
            file=sys.stderr,
        )
    return pair.target, target_identity(pair.target_dir), views


async def serve(a: argparse.Namespace) -> None:
    from apps.cloud.server import Limits, VerifierServer
    from runtime.edge import wire

    for name in ("max_sessions", "max_context", "max_frame"):
        v = getattr(a, name)
        if v is not None and v < 1:
            raise DuetError(f"--{name.replace('_', '-')} must be at least 1 (got {v})")
    if a.idle_timeout <= 0:
        raise DuetError(f"--idle-timeout must be positive (got {a.idle_timeout})")
    if not 0 <= a.port <= 65535:
        raise DuetError(f"--port must be in [0, 65535] (got {a.port})")
    token = read_token(a.token_file)
    limits = Limits(a.max_sessions, a.max_context, a.idle_timeout, a.max_frame or wire.MAX_FRAME)
    from apps.cloud.server import is_loopback

    if token is None and not is_loopback(a.host):  # check before the (slow) model load
        raise DuetError(f"refusing to serve on {a.host} without --token-file")
    model, identity, views = load_target(a.target, a.target_backend, a.target_threads, a.adapter)
    server = VerifierServer(model, token=token, limits=limits, identity=identity, adapters=views)
    try:
        host, port = await server.start(a.host, a.port)
    except OSError as e:
        raise DuetError(f"cannot bind {a.host}:{a.port}: {e.strerror or e}") from None
    print(f"listening on {host}:{port}", flush=True)
    try:
        await server.server.serve_forever()
    finally:
        server.close()


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        asyncio.run(serve(a))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
