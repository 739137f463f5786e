"""One round of the edge loop (runtime/edge/loop.py), in its stages: what a session fixes before
round one (`EdgeLink`: codec, encoder, CU-HLM's skipper, the K* controller, the frame header),
the round's K, the event of a window of skipped drafts that is not sent, and a verified round.

What it is not: the loop itself (the sequence, the draft cache and the session's lifetime stay
in loop.py) or the wire format (runtime/edge/wire.py, the codecs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from runtime.decoding.events import StepEvent
from runtime.edge import wire
from runtime.edge.client import CloudError, Connection
from runtime.edge.skip import Skipper


@dataclass
class EdgeLink:
    """What a session fixes before its first round."""

    conn: Connection
    cod: ModuleType  # the codec's module (runtime/edge/codecs)
    enc: object  # its encoder, one per session (C-SQS keeps state across rounds)
    vocab: int
    skipper: Skipper | None  # CU-HLM's LOSSY skip rule, or None
    controller: object | None  # devices.kstar.AdaptiveK, or None (fixed K, or a bit budget)
    bit_budget: int | None
    head: int = 0  # bytes of a VERIFY frame with no rows: wire header + codec header

    def __post_init__(self) -> None:
        empty = np.zeros((0, self.vocab), np.float32)
        enc = self.enc
        self.head = len(wire.pack(wire.VERIFY, 0, 0, wire.verify(self.cod.NUMBER, 0, b""))) + (
            enc.kernel.header_bytes()
            if hasattr(enc, "kernel")
            else len(enc.encode([], empty, self.vocab))
        )

    def prime(self) -> None:
        """Give the K* controller the link's E[1/R] for eq. (8)'s b/R_n and, for a codec whose
        rows have one size (FIXED_ROWS), that size: eq. (11) then picks round one too."""
        link = getattr(self.conn.link, "link", None)
        if link is None or not hasattr(self.controller, "expect_link"):
            return
        self.controller.expect_link(link.mean_inverse_rate())
        if getattr(self.cod, "FIXED_ROWS", False):
            V, enc = self.vocab, self.enc
            row = len(enc.encode([0], np.full((1, V), 1.0 / V, np.float32), V)) - len(
                enc.encode([], np.zeros((0, V), np.float32), V)
            )
            self.controller.expect_rows(8.0 * row, link.rtt_s, 8.0 * self.head)

    def want(self, k: int | None, k_max: int) -> int:
        """The round's K before the caps: fixed, else K* from the controller, else (a bit
        budget ends the round itself, SQS §4) k_max, else a fixed 4."""
        if k is not None:
            return k
        if self.controller is not None:
            return self.controller.choose(k_max)
        return k_max if self.bit_budget is not None else 4

    def observer(self, flags: list):
        """CU-HLM's per-draft hook for draft_window, appending (u, skipped, x_d = q̂(d)) to
        `flags`; None without a skipper."""
        if self.skipper is None:
            return None

        def observe(logits, d, q_row):
            u = self.skipper.uncertainty(logits, d)  # eq. (8)-(9)
            s = self.skipper.decide(u)  # eq. (10)
            if s:
                self.enc.skip_last()  # its row on the wire is the id alone
            flags.append((u, s, float(q_row[d])))

        return observe

    def verify(
        self, seq: list[int], held: list[int], drafts: list[int], q, flags: list, t0: float
    ) -> tuple[list[int], int, dict, float, float]:
        """Send held + drafts, check and apply the verdict (A, c); returns the committed
        tokens, A, the round's `extra["edge"]` record, its draft time (since `t0`, encoding
        included) and the round trip's wall time."""
        conn, enc, g = self.conn, self.enc, len(drafts)
        body = enc.encode(held + drafts, q, self.vocab)
        draft_s = time.perf_counter() - t0
        v, x = conn.verify(self.cod.NUMBER, len(seq) - len(held), body)
        a, c = v.accepted - len(held), v.token  # the verifier commits the held rows as is
        if not 0 <= a <= g or not 0 <= c < self.vocab or v.committed != len(seq) + a + 1:
            raise CloudError(f"the cloud verifier at {conn.where} sent an impossible verdict")
        enc.verdict(a, g)  # C-SQS: Alg. 1's backtrack of beta to the kept tokens
        round_ = {
            "k": g,
            "accepted": a,
            "bytes_up": x.bytes_up,
            "bytes_down": x.bytes_down,
            "rate_bps": x.rate_bps,
            "draft_s": draft_s,
            "uplink_s": x.uplink_s,
            "cloud_s": float(v.server_s),
            "downlink_s": max(0.0, x.downlink_s - v.server_s),
        }
        if self.controller is not None:
            self.controller.update(**round_, header_bytes=self.head)
        round_["model_bits"] = enc.last_bits  # header + eq. (1) body bits (compressed q)
        if self.bit_budget is not None:
            round_["body_bits"] = enc.last_bits - 8 * enc.kernel.header_bytes()  # <= B
        if hasattr(enc, "stats"):
            round_["codec_stats"] = enc.stats()
        if self.skipper:
            skipped = [(len(seq) + i, f[2]) for i, f in enumerate(flags[:a]) if f[1]]
            round_.update(
                sent=True,
                u=[f[0] for f in flags],
                skip_flags=[f[1] for f in flags],
                skipped=skipped,
            )
        return drafts[:a] + [c], a, round_, draft_s, x.wall_s


def unsent_event(drafts: list[int], flags: list, base: int, t0: float) -> StepEvent:
    """The event of a window whose drafts were all skipped (CU-HLM): committed here
    unverified, no round trip; `base` is the position of its first draft, `t0` when drafting
    began."""
    g, draft_s = len(drafts), time.perf_counter() - t0
    record = {
        "k": g,
        "accepted": g,
        "bytes_up": 0,
        "bytes_down": 0,
        "rate_bps": float("inf"),
        "draft_s": draft_s,
        "uplink_s": 0.0,
        "cloud_s": 0.0,
        "downlink_s": 0.0,
        "model_bits": 0,
        "sent": False,
        "u": [f[0] for f in flags],
        "skip_flags": [f[1] for f in flags],
        "skipped": [(base + i, f[2]) for i, f in enumerate(flags)],
    }
    return StepEvent(tokens=drafts, accepted=g, drafted=g, draft_s=draft_s, extra={"edge": record})
