"""The edge client's decoding loop (FlexSpec §IV-C): draft K tokens here, send them to the cloud
verifier, apply its verdict (A, c), keep the draft cache in step with the committed sequence.

K comes from a controller (devices.kstar.AdaptiveK: eq. (11) from the measured link, the
link condition's E[1/R] as a prior, and the per-token acceptance's estimate) or is fixed. The
bytes counted are the real frame lengths; the link emulator's waits are real sleeps inside
`Connection.request`, so wall-clock time includes them. This module opens no sockets itself (the
caller passes a connected `Connection`); a round's stages are in runtime/edge/rounds.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from runtime.decoding.events import Sampling, StepEvent, rewind
from runtime.decoding.sd import draft_window
from runtime.edge.client import CloudError, Connection
from runtime.edge.codecs import codec as get_codec
from runtime.edge.codecs import new_encoder
from runtime.edge.codecs.lossy import MAX_ROWS
from runtime.edge.rounds import EdgeLink, unsent_event
from runtime.edge.skip import Skipper
from runtime.errors import DuetError


def edge_steps(
    draft,
    conn: Connection,
    seq: list[int],
    *,
    max_new: int,
    sampling: Sampling,
    seed: int,
    k: int | None = None,
    k_max: int = 8,
    controller=None,
    codec: str | None = None,
    codec_params: dict | None = None,
    draft_cache=None,
    skip=None,
    bit_budget: int | None = None,
) -> Iterator[StepEvent]:
    """Yield one StepEvent per round; `extra["edge"]` holds the round's k, bytes, rate and times.

    k fixes K; otherwise `controller.choose(k_max)` picks it each round and
    `controller.update(...)` learns from the round. codec defaults to `ids` at T = 0 and `raw`
    (ids + q) at T > 0. The server session is closed when the generator is closed.
    `skip` (runtime.edge.skip.SkipRule, cu-hlm at T > 0 only) turns on CU-HLM's LOSSY skipping:
    drafts with u <= u_th are committed unverified, and a window of only such drafts is not
    sent (its ids lead the next window); rounds then carry `u`, `skipped` and `sent`.
    `bit_budget` B (k-sqs, c-sqs only) is SQS §4's per-batch uplink budget: a round drafts until
    the next row would push its body bits over B, or until K (k, else k_max: the budget and not
    the K* controller sets the batch length) or max_new; rounds then carry `body_bits`.
    """
    check_k(k, k_max)
    opts = dict(codec=codec, codec_params=codec_params, skip=skip, bit_budget=bit_budget)
    lk = open_link(draft, conn, sampling, seed, controller=controller, **opts)
    seq = list(seq)
    dc = draft_cache if draft_cache is not None else draft.new_cache()
    rng = open_session(lk, conn, seq, sampling, seed)
    room = _room(draft, conn)
    produced = 0
    held: list[int] = []  # skipped drafts committed here, not yet sent (they lead the next body)
    try:
        while produced < max_new:
            g = max(
                0,
                min(
                    lk.want(k, k_max), max_new - produced - 1, room - len(seq), MAX_ROWS - len(held)
                ),
            )
            flags: list[tuple[float, bool, float]] = []  # per draft: u, skipped, x_d = q̂(d)
            t0 = time.perf_counter()
            drafts, q = draft_window(
                draft, dc, seq, g, sampling, rng, law=lk.enc.draft_law, observe=lk.observer(flags)
            )
            g = len(drafts)  # SQS §4: the budget may end the window early
            if lk.skipper and g and all(f[1] for f in flags):  # nothing to verify: no round trip
                base = len(seq)
                seq += drafts
                held += drafts
                produced += g
                yield unsent_event(drafts, flags, base, t0)
                continue
            committed, a, round_, draft_s, wall_s = lk.verify(seq, held, drafts, q, flags, t0)
            held = []
            seq += committed
            produced += len(committed)
            rewind(dc, len(seq) - 1)  # FlexSpec §IV-C: the edge rolls back with the cloud
            yield StepEvent(
                tokens=committed,
                accepted=a,
                drafted=g,
                draft_s=draft_s,
                verify_s=wall_s,
                extra={"edge": round_},
            )
    finally:
        rewind(dc, len(seq))
        try:
            conn.close_session()
        except CloudError:
            pass


def check_k(k: int | None, k_max: int) -> None:
    """A DuetError unless K (fixed; None: the controller's) is >= 0 and its cap k_max >= 1."""
    if k is not None and k < 0:
        raise DuetError(f"--k must be >= 0 (got {k})")
    if k_max < 1:
        raise DuetError(f"--k-max must be >= 1 (got {k_max})")


def open_session(lk: EdgeLink, conn: Connection, seq: list[int], sampling: Sampling, seed: int):
    """Prime the link and open the verifier's session on the prompt `seq`; returns the edge's
    generator. The seed gives two independent streams: the draft's draws must not reuse the
    server's uniforms."""
    edge_seed, cloud_seed = np.random.SeedSequence(seed).spawn(2)
    lk.prime()
    cloud = int(cloud_seed.generate_state(1, np.uint64)[0])
    conn.open(seq, sampling.temp, sampling.top_p, sampling.top_k, cloud)
    return np.random.default_rng(edge_seed)


def _room(draft, conn: Connection) -> int:
    """The committed length a round's window may reach: one short of the pair's context (the
    correction token), and no further than a static-shape draft's `context` slots
    (runtime/backends/onnx/static_host.py; past them rounds send K = 0 and the cloud decodes
    alone)."""
    ctx = min(conn.welcome.max_context, draft.config.max_context)
    return min(ctx - 1, getattr(draft, "context", ctx))


def open_link(
    draft,
    conn: Connection,
    sampling: Sampling,
    seed: int,
    *,
    codec: str | None,
    codec_params: dict | None,
    skip,
    bit_budget: int | None,
    controller,
) -> EdgeLink:
    """Check the pair, the codec, --skip and --bit-budget against each other and the verifier;
    returns the session's EdgeLink (a bit budget drops the controller: it sets L^t itself)."""
    V = draft.config.vocab_size
    if conn.welcome.vocab_size != V:
        raise DuetError(
            f"the cloud target's vocabulary ({conn.welcome.vocab_size}) differs "
            f"from the draft's ({V})"
        )
    cod = get_codec(codec or ("ids" if sampling.greedy else "raw"))
    if not sampling.greedy and not cod.CARRIES_Q:
        raise DuetError(f"codec {cod.NAME} carries no q; sampling (--temp > 0) needs one that does")
    enc = new_encoder(cod, V, codec_params)
    if bit_budget is not None:
        check_bit_budget(bit_budget, cod.NAME)
        enc.budget = bit_budget  # SQS §4: L^t = max{L : sum_{n<=L} b_n(K_n, ell) <= B}
        controller = None  # the budget sets L^t; K (else k_max) only caps it
    skipper = None
    if skip is not None:
        if cod.NAME != "cu-hlm" or sampling.greedy:
            raise DuetError(
                "--skip is CU-HLM's: it needs --codec cu-hlm and --temp > 0 "
                f"(got --codec {cod.NAME}, --temp {sampling.temp:g})"
            )
        skipper = Skipper(skip, np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2]))
    if cod.NAME not in conn.welcome.codecs:
        raise DuetError(f"the cloud verifier does not speak codec {cod.NAME}")
    return EdgeLink(conn, cod, enc, V, skipper, controller, bit_budget)


def check_bit_budget(budget: int, codec: str) -> None:
    """A DuetError unless `budget` (SQS §4's per-batch body bits) is >= 1 and `codec` is one
    whose rows have a bit model the budget can count (k-sqs, c-sqs)."""
    if budget < 1:
        raise DuetError(f"--bit-budget must be at least 1 bit (got {budget})")
    if codec not in ("k-sqs", "c-sqs"):
        raise DuetError(
            f"--bit-budget is SQS §4's per-batch budget: it needs --codec k-sqs "
            f"or c-sqs (got {codec})"
        )


def edge_summary(events) -> dict:
    """The `stats.edge` object: per-round lists and their totals."""
    rounds = [ev.extra["edge"] for ev in events if "edge" in ev.extra]
    keys = ("k", "accepted", "bytes_up", "bytes_down", "rate_bps", "draft_s", "uplink_s",
            "cloud_s", "downlink_s", "model_bits")  # fmt: skip
    out: dict = {"rounds": len(rounds), "sent_rounds": sum(r.get("sent", True) for r in rounds)}
    for key in keys:
        vals = [r[key] for r in rounds]
        out[key] = [v if v != float("inf") else None for v in vals]
    if any("body_bits" in r for r in rounds):  # SQS §4's budget: each round's body bits
        out["body_bits"] = [r.get("body_bits") for r in rounds]
    if rounds and rounds[-1].get("codec_stats"):
        out["codec_stats"] = rounds[-1]["codec_stats"]  # C-SQS: Theorem 2 over the run
    n = sum(len(ev.tokens) for ev in events) or 1
    out["mean_k"] = sum(out["k"]) / len(rounds) if rounds else 0.0
    out["bytes_up_per_token"] = sum(out["bytes_up"]) / n
    out["bytes_down_per_token"] = sum(out["bytes_down"]) / n
    for key in ("draft_s", "uplink_s", "cloud_s", "downlink_s"):
        out[f"total_{key}"] = sum(out[key])
    return out
