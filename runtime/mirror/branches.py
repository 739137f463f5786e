"""Branch-complete rollouts: which branches to prepare, in what order, and when one is reused.

A branch (j, v) is the next window that would follow `committed + d1..dj + v`:
the target accepts j draft tokens and then commits v (a correction, or the bonus
token when j = γ). Candidates v come from the early-exit top-κ at window
position j (Mirror-SD eq. 7-8), excluding the draft's own token d_{j+1} there
(that path is the accepted one, covered by deeper positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.topk_channel import log_softmax, top_rows


@dataclass(frozen=True)
class Branch:
    """Branch (j, v): the next window after `committed + d1..dj + v`."""

    depth: int  # j: draft tokens accepted before the branch point
    token: int  # v: the correction (or the bonus token when j = γ)
    score: float  # early-exit estimate of log P(A = j, c = v)


def rank_branches(ids: np.ndarray, logp: np.ndarray, drafts: list[int]) -> list[Branch]:
    """Every branch of the hypothesis tree T_t, most likely first.

    ids, logp: the early-exit message, (γ+1, κ) (Mirror-SD eq. 7-8). Greedy, the
    log-probability of branch (j, v) is estimated from the early-exit proxy alone:
        sum_{i<j} log p̃_i(d_{i+1}) + log p̃_j(v),
    where a draft token outside row i's top-κ gets that row's κ-th log-prob (an upper
    bound). When sampling, the message is coupled to the verifier's noise and ranked by
    runtime/mirror/coupled.rank_coupled instead. Branches of all depths run together in one
    masked batch, so they are ranked one by one, not by depth. The ranking only orders the
    rollouts: it never changes the output.
    """
    path = 0.0
    out = []
    for j in range(len(drafts) + 1):
        row_ids, row_lp = ids[j], logp[j]
        own = drafts[j] if j < len(drafts) else None
        out += [
            Branch(j, int(v), path + float(lp))
            for v, lp in zip(row_ids, row_lp, strict=True)
            if v != own
        ]
        if own is not None:
            hit = np.nonzero(row_ids == own)[0]
            path += float(row_lp[hit[0]]) if hit.size else float(row_lp[-1])
    return sorted(out, key=lambda b: -b.score)


def rank_own_branches(logits: np.ndarray, drafts: list[int], m: int) -> list[Branch]:
    """The draft's own runner-up branches, most likely first (rolled out before the early exit).

    logits: the draft's at window positions 0..γ, (γ+1, V). At each position j the m most
    likely tokens other than the draft's own d_{j+1} (at j = γ, the bonus position, the m most
    likely) are the candidates v; branch (j, v) is scored by the draft's own path probability
    sum_{i<j} log q_i(d_{i+1}) + log q_j(v), the draft-side twin of `rank_branches`.
    """
    z = np.asarray(logits, dtype=np.float32)
    n = min(len(drafts) + 1, len(z))
    z = z[:n]
    m = min(m, z.shape[-1] - 1)
    logq = log_softmax(z)  # one fused pass; the candidates from the logits (log q's order)
    tops = top_rows(z, m + 1)  # m + 1: one of them may be d_{j+1}
    path, out = 0.0, []
    for j in range(n):
        own = drafts[j] if j < len(drafts) else None
        out += [Branch(j, int(v), path + float(logq[j, v])) for v in tops[j] if v != own][:m]
        if own is not None:
            path += float(logq[j, own])
    return sorted(out, key=lambda b: -b.score)


def in_tree(accepted: int, token: int, ids: np.ndarray) -> bool:
    """Is the corrected prefix Π⁺ = (d1..dA, c) a path of the hypothesis tree T_t?

    True iff c is among the early-exit top-κ at window position A (§3.1; App. E's F_t = 0).
    """
    return bool((ids[accepted] == token).any())


def reuse_key(accepted: int, token: int) -> tuple[int, int]:
    """The §3.1 reuse rule as a lookup key into the completed branches.

    - A = 0 and c in position 0's top-κ: the branch rooted at c, i.e. (0, c);
    - A ≥ 1 and Π⁺ on a precomputed path: the continuation at depth τ = A + 1, i.e. (A, c);
    - A = γ (all accepted): c is the bonus token, branch (γ, c).
    Reuse happens iff this branch was *completed* before the final-verification
    message arrived; otherwise the draft falls back to a fresh rollout from committed + c.
    """
    return (accepted, token)
