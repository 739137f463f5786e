"""The flags of `--method flexspec` (shared by runtime.generate, runtime.chat, apps.bench) and
the command-layer code that turns them into a connected client: a `--server local` verifier
subprocess or HOST:PORT with a token, the link emulator and the K* controller (both from
devices/, built here in the command layer and passed down into the method's options).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import converters  # noqa: F401 (registers the on-the-fly exports the engine asks for: STYLE 11)
from runtime.errors import DuetError


def add_edge_args(ap: argparse.ArgumentParser) -> None:
    """--server, --token-file, --adapter-name, --link, --link-seed, --k, --k-max, codec flags."""
    g = ap.add_argument_group("edge-cloud (--method flexspec)")
    g.add_argument(
        "--server",
        default="local",
        metavar="HOST:PORT|local",
        help="cloud verifier; local (default) starts one on 127.0.0.1 for --target (and --adapter)",
    )
    g.add_argument("--token-file", help="file with the verifier's shared secret")
    g.add_argument(
        "--adapter-name",
        default=None,
        metavar="NAME",
        help="the verifier's LoRA adapter the session runs (default: --adapter's "
        "directory name with --adapter, else the base target)",
    )
    g.add_argument(
        "--link",
        default="none",
        help="emulated wireless link: none, 5g, 4g, wifi-weak (default none)",
    )
    g.add_argument("--link-seed", type=int, default=0, help="seed of the link's fading (default 0)")
    g.add_argument(
        "--k", type=int, default=None, help="fixed draft length K (default: K* per round)"
    )
    g.add_argument("--k-max", type=int, default=8, help="bound on K* (default 8)")
    g.add_argument(
        "--k-min",
        type=int,
        choices=(0, 1),
        default=1,
        help="K*'s lower bound: 1 as FlexSpec's eq. (11), or 0 to let it choose rounds "
        "that draft nothing (the cloud's own token) where drafting loses "
        "(default 1)",
    )
    g.add_argument(
        "--codec",
        default=None,
        help="uplink payload: ids (T = 0 only), raw, k-sqs, c-sqs, cu-hlm "
        "(default ids at T = 0, raw at T > 0)",
    )
    g.add_argument("--sqs-k", type=int, default=None, help="k-sqs: support size K (default 512)")
    g.add_argument(
        "--ell", type=int, default=None, help="k-sqs/c-sqs: lattice resolution ell (default 4000)"
    )
    g.add_argument(
        "--alpha", type=float, default=None, help="c-sqs: target dropped mass alpha (default 0.05)"
    )
    g.add_argument("--eta", type=float, default=None, help="c-sqs: step eta (default 0.01)")
    g.add_argument(
        "--beta", type=float, default=None, help="c-sqs: initial threshold beta (default 0.01)"
    )
    g.add_argument(
        "--bit-budget",
        type=int,
        default=None,
        metavar="B",
        help="k-sqs/c-sqs: SQS §4's per-round uplink budget in body bits; a round "
        "drafts until the next row would exceed B (capped by --k, else "
        "--k-max; no K* controller)",
    )
    g.add_argument("--cu-k", type=int, default=None, help="cu-hlm: top-k sent (default 256)")
    g.add_argument(
        "--cu-levels",
        default=None,
        choices=("log", "linear"),
        help="cu-hlm: what the 8-bit probabilities mean: log (2^(-16 v/255), "
        "default) or linear (v/255, what older clients send)",
    )
    g.add_argument(
        "--skip",
        action="store_true",
        help="cu-hlm, --temp > 0: LOSSY CU-HLM skipping: commit drafts whose "
        "uncertainty is <= u_th without verification (stats say lossy)",
    )
    g.add_argument(
        "--u-th",
        type=float,
        default=None,
        help="--skip: the threshold u_th (default: Theorem 1, eq. 12, with the "
        "embedded pair's fit)",
    )


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DuetError(f"--server must be HOST:PORT or local (got {text!r})")
    return host.strip("[]"), int(port)


def check_edge_args(a: argparse.Namespace) -> None:
    """One clear line for a bad --k, --k-max, --link or --server."""
    from devices.links import LINK_NAMES
    from runtime.decoding.flexspec import Options, check

    check(Options(k=a.k, k_max=a.k_max))
    if a.link not in LINK_NAMES:
        raise DuetError(f"unknown --link {a.link!r}; choose from {', '.join(LINK_NAMES)}")
    if a.server != "local":
        _host_port(a.server)
    adapter_name(a)
    codec_params(a)
    skip_rule_from(a)
    check_bit_budget(a)


def check_bit_budget(a: argparse.Namespace, codecs: tuple[str, ...] | None = None) -> None:
    """One line for --bit-budget below 1 or with a codec other than k-sqs / c-sqs (`codecs`: the
    ones a run will use; default --codec's)."""
    from runtime.edge.loop import check_bit_budget as check

    b = getattr(a, "bit_budget", None)
    if b is None:
        return
    for name in codecs or (a.codec or ("ids" if getattr(a, "temp", 0) == 0 else "raw"),):
        check(b, name)


def adapter_name(a: argparse.Namespace) -> str:
    """The adapter the session names at OPEN: --adapter-name, else --adapter's directory name,
    else "" (the base target); one line for a name the wire cannot carry, or --adapter-name
    with --server local but no --adapter (the local verifier holds only --adapter)."""
    from runtime.adapter_views import NAME_RE

    name, adapter = getattr(a, "adapter_name", None), getattr(a, "adapter", None)
    if name is not None and not NAME_RE.fullmatch(name):
        raise DuetError(f"--adapter-name {name!r}: 1 to 64 of A-Z a-z 0-9 . _ + -")
    if name is not None and a.server == "local" and adapter is None:
        raise DuetError(
            "--adapter-name picks an adapter of a remote verifier (--server "
            "HOST:PORT); with --server local pass --adapter DIR"
        )
    if name is None and adapter is not None:
        name = Path(adapter.rstrip("/")).name
        if not NAME_RE.fullmatch(name):
            raise DuetError(
                f"--adapter {adapter}: its directory name cannot name it on the "
                "wire; add --adapter-name NAME"
            )
    return name or ""


def _local_base(a: argparse.Namespace):
    """The target directory before any adapter (what the local verifier loads)."""
    from runtime.loading import resolve

    if a.target is not None:
        return resolve(a.target, "target")
    from runtime.assets import default_pair

    return default_pair()[0]


def skip_rule_from(a: argparse.Namespace):
    """The SkipRule of --skip (None without it); one line for --u-th without --skip, --skip
    with a codec other than cu-hlm, or at --temp 0."""
    from runtime.edge.skip import skip_rule

    if not getattr(a, "skip", False):
        if getattr(a, "u_th", None) is not None:
            raise DuetError("--u-th applies only with --skip")
        return None
    if a.codec != "cu-hlm":
        raise DuetError(
            "--skip is CU-HLM's uncertainty-aware skipping: it needs --codec cu-hlm "
            f"(got --codec {a.codec or 'default'})"
        )
    return skip_rule(getattr(a, "temp", 0.0), a.u_th)


CODEC_FLAGS = {"k-sqs": {"sqs_k": "k", "ell": "ell"},
                "c-sqs": {"ell": "ell", "alpha": "alpha", "eta": "eta", "beta": "beta"},
                "cu-hlm": {"cu_k": "k", "cu_levels": "levels"}}  # fmt: skip


def codec_params(a: argparse.Namespace) -> dict | None:
    """The chosen codec's parameters from its flags (its DEFAULTS for the rest); one line for an
    unknown codec, ids at --temp > 0, a flag another codec owns, or a value out of range."""
    from runtime.edge.codecs import codec, new_encoder

    name = a.codec or ("ids" if getattr(a, "temp", 0) == 0 else "raw")
    mod = codec(name)
    if getattr(a, "temp", 0) > 0 and not mod.CARRIES_Q:
        raise DuetError(
            f"--codec {name} carries no q, so it cannot be verified at --temp > 0; "
            "use raw, k-sqs, c-sqs or cu-hlm"
        )
    owned = CODEC_FLAGS.get(name, {})
    for flag in ("sqs_k", "ell", "alpha", "eta", "beta", "cu_k", "cu_levels"):
        if getattr(a, flag, None) is not None and flag not in owned:
            raise DuetError(f"--{flag.replace('_', '-')} does not apply to --codec {name}")
    for flag in ("sqs_k", "ell", "cu_k"):
        if getattr(a, flag, None) is not None and getattr(a, flag) < 1:
            raise DuetError(f"--{flag.replace('_', '-')} must be at least 1")
    params = {key: getattr(a, flag) for flag, key in owned.items() if getattr(a, flag) is not None}
    if name in CODEC_FLAGS:
        enc = new_encoder(mod, 2**16, params)  # builds the kernel codec: its checks, one line
        if getattr(enc.kernel, "ell", 1) > 0xFFFF:
            raise DuetError("--ell must be at most 65535")
    return params or None


@contextlib.contextmanager
def edge_options(a: argparse.Namespace, target_dir, target_backend: str = "auto"):
    """Yield the flexspec options (conn, k, k_max, controller) for these flags; on exit close the
    connection and stop a local verifier."""
    from devices.kstar import AdaptiveK
    from devices.links import emulator
    from runtime.edge.client import Connection
    from runtime.edge.local import LocalVerifier

    check_edge_args(a)
    name = adapter_name(a)
    local = None
    try:
        if a.server == "local":
            extra: tuple[str, ...] = ()
            if getattr(a, "adapter", None) is not None:  # the verifier holds base + the adapter
                target_dir, extra = _local_base(a), ("--adapter", f"{name}={a.adapter}")
            local = LocalVerifier(target_dir, target_backend=target_backend, extra_args=extra)
            host, port, token = local.host, local.port, local.token
        else:
            host, port = _host_port(a.server)
            token = b""
            if a.token_file:
                p = Path(a.token_file)
                if not p.is_file():
                    raise DuetError(f"--token-file {a.token_file}: no such file")
                token = p.read_bytes().strip()
        conn = Connection(host, port, token, link=emulator(a.link, a.link_seed), adapter=name)
        try:
            yield {
                "conn": conn,
                "k": a.k,
                "k_max": a.k_max,
                "controller": None if a.k is not None else AdaptiveK(k_min=a.k_min),
                "bit_budget": getattr(a, "bit_budget", None),
                "codec": a.codec,
                "codec_params": codec_params(a),
                "skip": skip_rule_from(a),
            }
        finally:
            conn.close()
    finally:
        if local is not None:
            local.stop()


def check_edge_method(a: argparse.Namespace) -> None:
    """check_edge_args when the command runs --method flexspec; nothing otherwise."""
    if getattr(a, "method", None) == "flexspec":
        check_edge_args(a)


@contextlib.contextmanager
def edge_session(a: argparse.Namespace, pair):
    """Yield (the session options, the stats settings) of --method flexspec: a connected
    verifier (edge_options, closed on exit) and the edge flags the run's stats report; two
    empty dicts for any other method."""
    if getattr(a, "method", None) != "flexspec":
        yield {}, {}
        return
    with edge_options(a, pair.target_dir, pair.settings["target_backend"]) as edge:
        yield (
            edge,
            {
                "k": a.k,
                "k_max": a.k_max,
                "k_min": a.k_min,
                "link": a.link,
                "link_seed": a.link_seed,
                "server": a.server,
            },
        )


def needs_local_target(a: argparse.Namespace) -> bool:
    """False when flexspec talks to a remote verifier and no --target was given: the edge then
    loads only the draft (the target may be far too large for this device)."""
    return not (
        getattr(a, "method", None) == "flexspec"
        and a.server != "local"
        and a.target is None
        and a.draft is not None
    )


def load_draft_only(a: argparse.Namespace):
    """A Pair whose `target` is the draft itself, used only for its config (vocabulary, context,
    EOS) and tokenizer; the verifier checks the vocabulary at HELLO."""
    from runtime.backends import backend_for_path, load_model
    from runtime.loading import Pair, resolve
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
