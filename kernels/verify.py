"""Verification of a drafted window (NumPy reference; MLX twin in verify_mlx.py).

Both functions take a window of γ draft tokens and the target's γ + 1
distributions over the positions `[last committed, d1..dγ]`, and return
(A, c): the number of accepted draft tokens and the token committed after
them (the correction at the first rejection, or the bonus token if all γ were
accepted). Each step therefore commits A + 1 tokens.
"""

from __future__ import annotations

import numpy as np

from kernels.sampling import sample


def verify_greedy(
    target_logits: np.ndarray, draft_tokens: np.ndarray, forced: np.ndarray | None = None
) -> tuple[int, int]:
    """Greedy rule: accept d_i while d_i == argmax p_i; c = argmax p_A.

    target_logits (γ+1, V), draft_tokens (γ,). The committed tokens are exactly
    the target's own greedy tokens, so the output equals target-alone decoding.
    `forced` (γ,) bool marks rows the edge skipped (CU-HLM eq. 10): accepted untested, which
    is lossy; None (the default) forces nothing.
    """
    best = np.asarray(target_logits).argmax(-1)
    d = np.asarray(draft_tokens)
    ok = best[: len(d)] == d
    if forced is not None:
        ok |= np.asarray(forced, bool)  # CU-HLM eq. (10): delta = 0, committed unverified
    miss = np.nonzero(~ok)[0]
    a = int(miss[0]) if miss.size else len(d)
    return a, int(best[a])


def verify_sampling(
    p: np.ndarray,
    q: np.ndarray,
    draft_tokens: np.ndarray,
    u_accept: np.ndarray,
    u_resample: float,
    forced: np.ndarray | None = None,
) -> tuple[int, int]:
    """Leviathan et al. / Chen et al. speculative sampling.

    Rule: accept d_i (i = 1..γ, in order) iff u_i < p_i(d_i) / q_i(d_i). At the
    first rejection i, c ~ norm(max(p_i - q_i, 0)) (residual resampling); if all
    are accepted, c ~ p_{γ+1} (bonus). With d_i ~ q_i this commits tokens whose
    law is exactly the target's p, provided q is *exactly* the distribution each
    d_i was drawn from.

    p (γ+1, V) target probs; q (γ, V) draft probs, or rows left coded (an object with
    `token_probs` (γ,) = q_i(d_i) and `row(i)` -> q_i, kernels/payload_sqs.CodedRows: only the
    first rejected row is ever expanded); u_accept (γ,); u_resample a scalar uniform (the
    correction by inverse CDF), or a Gumbel field of γ+1 rows, one per position
    (kernels.gumbel_field: the correction by Gumbel-max, the same law; Mirror-SD's
    noise-coupled early exit, runtime/mirror/coupled.py, predicts it from a proxy).
    `forced` (γ,) bool: rows skipped by the edge (CU-HLM eq. 10) are accepted whatever p says,
    which breaks the guarantee above (lossy, off unless the edge asks); None forces nothing.
    """
    p = np.asarray(p, dtype=np.float32)
    d = np.asarray(draft_tokens)
    g = len(d)
    rows = np.arange(g)
    if hasattr(q, "token_probs"):  # coded rows: q_i(d_i) sent beside them, rows on demand
        qd, q_row = np.asarray(q.token_probs, np.float32), q.row
    else:
        q = np.asarray(q, dtype=np.float32)
        qd, q_row = q[rows, d], q.__getitem__
    pd = p[rows, d]
    ok = np.asarray(u_accept, dtype=np.float32) * qd < pd  # u < p/q without dividing by q = 0
    if forced is not None:
        ok |= np.asarray(forced, bool)  # CU-HLM eq. (10): delta = 0, committed unverified
    miss = np.nonzero(~ok)[0]
    draw = _drawer(u_resample)
    if miss.size == 0:
        return g, draw(p[g], g)
    a = int(miss[0])
    residual = np.maximum(p[a] - q_row(a), 0.0)
    if residual.sum() <= 0:  # only when p_a == q_a up to rounding; then p_a is the residual's limit
        residual = p[a]
    return a, draw(residual, a)


def _drawer(u_resample):
    """(probs, row) -> token: inverse CDF with a scalar uniform, Gumbel-max with a noise field."""
    if hasattr(u_resample, "argmax"):  # kernels.gumbel_field.GumbelField: reads a few blocks
        return lambda probs, row: u_resample.argmax(probs, row, log=True)
    return lambda probs, row: int(sample(probs, u_resample))
