"""One client's verification session on the cloud: its committed sequence, its own target KV
cache, its sampling settings and RNG. Pure and synchronous (the server runs it on its worker
thread); it knows nothing about sockets or frames beyond raising ProtocolError.

Rollback (FlexSpec §IV-C): after each verdict the cache is trimmed to the committed prefix, so
rejected draft positions never stay in the cache.
"""

from __future__ import annotations

import time

import numpy as np

from kernels.verify import verify_greedy, verify_sampling
from runtime.decoding.events import Sampling, pending, rewind
from runtime.edge import wire
from runtime.edge.codecs import Draft
from runtime.edge.wire import ProtocolError


class Session:
    """A verification session over a shared target; `max_context` bounds its sequence."""

    def __init__(self, target, open_: wire.Open, max_context: int):
        V = target.config.vocab_size
        if not open_.prompt:
            raise ProtocolError(wire.E_MALFORMED, "OPEN: the prompt is empty")
        bad = [t for t in open_.prompt if t >= V]
        if bad:
            raise ProtocolError(wire.E_VOCAB, f"OPEN: prompt token {bad[0]} outside [0, {V})")
        if len(open_.prompt) >= max_context:
            raise ProtocolError(
                wire.E_CONTEXT,
                f"OPEN: prompt of {len(open_.prompt)} tokens "
                f"does not fit the {max_context}-token session limit",
            )
        if not (np.isfinite(open_.temp) and open_.temp >= 0 and 0 < open_.top_p <= 1):
            raise ProtocolError(wire.E_MALFORMED, "OPEN: temp must be >= 0 and top_p in (0, 1]")
        self.target = target
        self.max_context = max_context
        self.sampling = Sampling(float(open_.temp), float(open_.top_p), int(open_.top_k))
        self.rng = np.random.default_rng(open_.seed)
        self.seq = list(open_.prompt)
        self.prompt_len = len(self.seq)
        self.cache = target.new_cache()
        if len(self.seq) > 1:  # prefill all but the last token, which the first window feeds
            target.forward(np.array([self.seq[:-1]]), self.cache)

    def verify(self, draft: Draft, base: int) -> wire.Verdict:
        """Verify `draft` continuing the committed sequence of length `base`; commit A + 1."""
        t0 = time.perf_counter()
        if base != len(self.seq):
            raise ProtocolError(
                wire.E_SEQUENCE,
                f"VERIFY continues position {base} but the "
                f"session has committed {len(self.seq)} tokens",
            )
        k = len(draft.tokens)
        if len(self.seq) + k + 1 > self.max_context:
            raise ProtocolError(
                wire.E_CONTEXT,
                f"a window of {k} after {len(self.seq)} tokens "
                f"exceeds the {self.max_context}-token session limit",
            )
        if not self.sampling.greedy and draft.q is None:
            raise ProtocolError(
                wire.E_CODEC,
                "sampling (temp > 0) needs a codec carrying q "
                "(e.g. raw); this payload has ids only",
            )
        window = pending(self.cache, self.seq) + draft.tokens
        logits = self.target.forward(np.array([window]), self.cache)[0, -(k + 1) :]  # (K+1, V)
        d = np.array(draft.tokens, dtype=np.int64)
        forced = draft.forced  # rows the edge skipped (CU-HLM eq. 10): committed unverified
        if self.sampling.greedy:
            a, c = verify_greedy(logits, d, forced)
        else:
            p = self.sampling.probs(logits)
            a, c = verify_sampling(p, draft.q, d, self.rng.random(k), self.rng.random(), forced)
        self.seq += draft.tokens[:a] + [c]
        rewind(
            self.cache, len(self.seq) - 1
        )  # FlexSpec §IV-C: roll the KV cache back to the prefix
        return wire.Verdict(a, c, len(self.seq), time.perf_counter() - t0)

    def rollback(self, keep: int) -> int:
        """Drop committed tokens beyond `keep` (at least the prompt); returns the new length."""
        if not self.prompt_len <= keep <= len(self.seq):
            raise ProtocolError(
                wire.E_SEQUENCE,
                f"ROLLBACK to {keep}: must be between the "
                f"prompt ({self.prompt_len}) and {len(self.seq)}",
            )
        del self.seq[keep:]
        rewind(self.cache, keep - 1)
        return keep

    def cache_bytes(self) -> int:
        """Bytes the session's KV cache holds now (0 when the backend does not say)."""
        n_layers = len(getattr(self.cache, "_kv", ()))
        return sum(int(a.nbytes) for i in range(n_layers) for a in self.cache.get(i))
