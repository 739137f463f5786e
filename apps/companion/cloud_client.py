"""`run --server`: the reference client of the edge-cloud protocol, from the bundle alone.

Order (the one the phone app follows, README.md): verify every file against the manifest
(before any connection), read edge.json and the profile, load the tokenizer and the static
ONNX draft through ONNX Runtime, connect and say HELLO with the bundle's claim (the verifier
refuses a draft it cannot verify), then FlexSpec rounds (runtime/edge/loop.py) with K* from the
profile's latency parameters (devices/kstar.py, eq. (11)) and the bundle's codec. Nothing else
on this machine is read: no checkpoint, no shipped profile.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from apps.companion.client import answer, bundle_prompt
from apps.companion.edge_side import read_edge
from apps.companion.verify import verify_bundle
from runtime.errors import DuetError


def host_port(text: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port); DuetError naming the flag otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DuetError(f"--server must be HOST:PORT (got {text!r})")
    return host.strip("[]"), int(port)


def read_token(path: str | None) -> bytes:
    """The shared secret in `path` (b"" without one: a loopback verifier without a token)."""
    if path is None:
        return b""
    p = Path(path)
    if not p.is_file():
        raise DuetError(f"--token-file {path}: no such file")
    return p.read_bytes().strip()


def run_through_cloud(
    bundle: str | Path,
    *,
    server: str,
    token_file: str | None,
    prompt: str | None,
    prompt_ids: list[int] | None,
    max_tokens: int,
    link: str = "none",
    link_seed: int = 0,
    k: int | None = None,
    k_max: int = 8,
    temp: float = 0.0,
    seed: int = 0,
    threads: int = 1,
) -> dict:
    """Generate through the verifier at `server`; returns {tokens, text, stats} where
    stats.edge holds the per-round lists (k, accepted, bytes, link rate, times)."""
    from devices.kstar import AdaptiveK
    from devices.links import LINK_NAMES, emulator
    from runtime.arg_rules import check_sampling
    from runtime.backends.onnx.static_host import StaticOnnxLM
    from runtime.decoding.events import Sampling
    from runtime.edge.client import Connection
    from runtime.edge.loop import edge_summary
    from runtime.session import GenerationSession

    host, port = host_port(server)
    if link not in LINK_NAMES:
        raise DuetError(f"unknown --link {link!r}; choose from {', '.join(LINK_NAMES)}")
    check_sampling(temp)
    token = read_token(token_file)
    b = Path(bundle)
    t0 = time.perf_counter()
    manifest = verify_bundle(b)  # every hash, before any connection
    edge = read_edge(b, manifest)
    t_verify = time.perf_counter() - t0
    tok, ids = bundle_prompt(b, manifest, prompt, prompt_ids)
    draft = StaticOnnxLM.load(b / "draft.onnx", threads=threads)
    conn = Connection(host, port, token, link=emulator(link, link_seed), claim=edge.claim)
    controller = None if k is not None else AdaptiveK(params=edge.flexspec)
    events, out = [], []
    t1 = time.perf_counter()
    try:
        # the draft stands in for the target (the verifier holds it): its config and EOS
        pair = SimpleNamespace(target=draft, draft=draft, tokenizer=None)
        options = {
            "conn": conn,
            "k": k,
            "k_max": k_max,
            "controller": controller,
            "codec": edge.codec,
            "codec_params": edge.codec_params or None,
        }
        session = GenerationSession(
            pair,
            method="flexspec",
            options=options,
            summarize=False,
            eos=draft.config.eos_token_ids,
        )
        for r in session.stream(ids, max_tokens, sampling=Sampling(temp), seed=seed):
            out += r.tokens
            events.append(r.step)
    finally:
        conn.close()
    wall = time.perf_counter() - t1
    return answer(
        tok,
        ids,
        out,
        t_verify,
        "wall_s",
        wall,
        server=f"{host}:{port}",
        codec=edge.codec,
        profile=edge.profile_name,
        k_policy=f"fixed {k}" if k is not None else "K* (eq. 11)",
        link=link,
        engine=f"onnx ({draft.qdq_path})",
        edge=edge_summary(events),
    )


def round_lines(stats: dict) -> list[str]:
    """One line per round (k, accepted, bytes up/down, times in ms), then the totals."""
    e = stats["edge"]
    ms = lambda x: f"{1e3 * x:7.2f}"  # noqa: E731
    lines = [" round   k   A  up B  down B  draft ms  uplink ms  cloud ms  downlink ms"]
    for i in range(e["rounds"]):
        lines.append(
            f"{i:6d} {e['k'][i]:3d} {e['accepted'][i]:3d} {e['bytes_up'][i]:6d} "
            f"{e['bytes_down'][i]:7d}   {ms(e['draft_s'][i])}    {ms(e['uplink_s'][i])}   "
            f"{ms(e['cloud_s'][i])}      {ms(e['downlink_s'][i])}"
        )
    acc = sum(e["accepted"]) / max(1, sum(e["k"]))
    lines.append(
        f"[{e['rounds']} rounds, mean K {e['mean_k']:.2f}, acceptance {acc:.2f}, "
        f"{e['bytes_up_per_token']:.1f} B up/token, {stats['tokens_per_s']} tok/s; codec "
        f"{stats['codec']}, profile {stats['profile'] or 'none'}, {stats['k_policy']}, "
        f"link {stats['link']}; bundle verified in {stats['verify_s']:.3f} s]"
    )
    return lines
