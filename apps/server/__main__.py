"""`python -m apps.server`: an OpenAI-compatible HTTP server over one target/draft pair.

    python -m apps.server                                  # embedded pair, sd, 127.0.0.1:8080
    python -m apps.server --target smollm2-135m-instruct   # a target alone: ar
    python -m apps.server --target DIR --draft DIR --method sd --port 0 --api-key KEY

Serves /v1/chat/completions (the checkpoint's chat template when it has one),
/v1/completions and /v1/models, streaming (server-sent events) or not. A request
naming a model the server does not hold gets OpenAI's 404 (`model_not_found`). Its
first stdout line is `listening on HOST:PORT` (with --port 0, the free port it got).
The port is bound before the models load, so a port in use fails at once. It binds
127.0.0.1 by default; another address needs --api-key (or --allow-no-key).
Try it:

    curl -s localhost:8080/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "def fib(n):", "max_tokens": 32, "temperature": 0}'
"""

from __future__ import annotations

import argparse
import socket
import sys

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


def build_parser() -> argparse.ArgumentParser:
    from runtime.cli_args import AUTO, add_auto_args, add_method_args, add_pair_args
    from runtime.decoding import METHODS

    ap = doc_parser("python -m apps.server", __doc__)
    add_pair_args(ap)
    ap.add_argument(
        "--method",
        choices=(*server_methods(METHODS), AUTO),
        default=None,
        help="decoding method (default sd; ar for a --target without --draft); "
        "auto: the one the latency model predicts fastest for this pair on this "
        "machine, chosen per request (the pair is measured at start-up, or read "
        "from what earlier runs kept: see --reprobe)",
    )
    add_auto_args(ap)
    add_method_args(ap)
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8080, help="port; 0 = any free one (default 8080)")
    ap.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every request (needed to bind "
        "an address other than loopback)",
    )
    ap.add_argument(
        "--allow-no-key",
        action="store_true",
        help="serve a non-loopback --host without --api-key: anyone who reaches the "
        "address can use the model",
    )
    ap.add_argument(
        "--queue",
        type=int,
        default=8,
        help="requests that may wait while one runs; more get 429 (default 8)",
    )
    ap.add_argument(
        "--model-id",
        default=None,
        help="the id /v1/models reports and requests name (default: the target's "
        "short name or directory name; duet-default for the embedded pair)",
    )
    return ap


def server_methods(methods) -> tuple[str, ...]:
    """The methods a server runs: all but flexspec (a client of a remote verifier)."""
    return tuple(m for m in methods if m != "flexspec")


def check_args(a: argparse.Namespace) -> None:
    if a.method is None:  # a target alone runs by itself; a pair (or the embedded one) speculates
        a.method = "ar" if a.target is not None and a.draft is None else "sd"
    if not 0 <= a.port <= 65535:
        raise DuetError(f"--port must be in [0, 65535] (got {a.port})")
    if a.queue < 0:
        raise DuetError(f"--queue must be >= 0 (got {a.queue})")
    from runtime.cli_args import check_method_args

    check_method_args(a)
    if a.api_key is not None and not a.api_key.strip():
        raise DuetError("--api-key is empty")
    from apps.cloud.server import is_loopback

    if a.api_key is None and not a.allow_no_key and not is_loopback(a.host):
        raise DuetError(
            f"refusing to serve on {a.host} without --api-key (only loopback is "
            "served keyless; --allow-no-key serves it anyway)"
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; a DuetError when the address is taken or bad."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise DuetError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise DuetError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(128)  # connections queue here while the models load
    return sock


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    check_args(a)
    sock = bind(a.host, a.port)  # before the heavy imports: a port in use fails in a second

    import uvicorn

    from apps.server.app import Server
    from apps.server.engine import Engine
    from runtime.cli_args import (
        AUTO,
        auto_announcement,
        auto_chooser,
        auto_options,
        load_pair_from_args,
        method_kwargs,
    )

    alone = a.method == AUTO and a.target is not None and a.draft is None  # auto: ar, or sd
    pair = load_pair_from_args(a, need_draft=a.method != "ar" and not alone)  # with a suffix
    name = a.model_id or getattr(pair, "name", None) or pair.target_dir.name
    chooser = auto_chooser(auto_options(a), pair) if a.method == AUTO else None
    if chooser is not None:  # its probe runs in the warm-up: before the server listens
        print(auto_announcement(chooser, "now"), file=sys.stderr, flush=True)
    engine = Engine(pair, method=a.method, model_id=name, chooser=chooser, **method_kwargs(a))
    engine.warmup()
    server = Server(engine, api_key=a.api_key, queue=a.queue)
    host, port = sock.getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    config = uvicorn.Config(
        server.app, log_level="warning", access_log=False, timeout_graceful_shutdown=2
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
