"""The acceptance laws `--method auto` predicts with, fitted on the pair at hand.

Acceptance α: from a short `sd` run (RUN_TOKENS tokens) on the first prompt seen, the
α whose E[τ] equals the mean tokens committed per step (cached per pair, γ and temperature):
the models' agreement on the target's own continuation, which is what sd and mirror verify.
Choosing γ as well, τ per γ comes from the pair's pooled accepted runs instead (pair_taus:
one longer sd run at the largest γ, then every run auto observes: RunLengths, a
product-limit estimate), each γ's α fitted to its own τ.
Ω̂, prompt-dependent, from the probe's pass over the prompt (its last 32 positions): how
often a correction is a branch candidate, i.e. in the exit layer's top-κ (eq. 9, tuned head
as mirror uses it) or among the draft's own runner-ups (prompt_hits), shrunk toward 0.4
with the weight of 8 rejections, pooled with every mirror run's steps (whether each step's
(A, c) was an own or an early-exit branch: observe_branches); once POOL_STEPS are pooled,
from those alone, the prompt not probed.
"""

from __future__ import annotations

import numpy as np

from devices import probe_memo as memo

PRIOR_OMEGA, PRIOR_WEIGHT = 0.4, 8.0
RUN_TOKENS = 48
JOINT_RUN_TOKENS = 128  # pair_taus: a longer run, since it sets the γ as well
OMEGA_POSITIONS = 32  # Ω̂ from the prompt's last positions: two heads over all would cost more
# pooled mirror steps from which Ω̂ comes from the runs alone (3x the prompt's positions):
# the prompt's probe (its passes, exit head and simulated steps) cost 52-158 ms a prompt, 3-7 %
# of a 128-token answer, and with the draft in its own process its draft pass is the child's
# to repeat (EMULATED m3-max, T = 1: .devrun/auto_cost17.py; auto 0.94-0.97x mirror@g6)
POOL_STEPS = 3 * OMEGA_POSITIONS


def alpha_for(tau: float, gamma: int) -> float:
    """The α whose E[τ] at γ (method_choice.expected_tokens) equals `tau`, by bisection."""
    from devices.method_choice import expected_tokens

    lo, hi = 0.0, 0.999
    for _ in range(40):  # E[τ](α) is increasing in α
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < tau else (lo, mid)
    return (lo + hi) / 2


HAZARD_PRIOR = 8.0  # steps: the weight of h_{j-1} in h_j's estimate (RunLengths.hazards)


class RunLengths:
    """The accepted runs A (drafts accepted per step) seen on one pair in one sampling regime,
    pooled over every sd and mirror run that reports them (the same verification: App. B).

    τ(γ) = 1 + E[min(A, γ)] = 1 + Σ_{k=1..γ} P(A ≥ k), with P(A ≥ k) = Π_{j<k} h_j and the
    hazard h_j = P(A ≥ j+1 | A ≥ j) estimated product-limit (Kaplan-Meier) style: from the
    steps at risk at j whose window γ_r > j, since a step's A is censored at its own γ_r (a
    run at γ 3 says nothing about A ≥ 4). Each h_j is shrunk toward h_{j-1} with the weight
    of HAZARD_PRIOR steps (`hazards`), so a tail seen on a handful of steps is not taken as
    a wall: one prompt's 128-token run at γ 8 accepted 5 or more on 3 of its
    steps, which had put τ(6) = τ(8) = 3.32 where 10 prompts measured τ(6) = 3.78 and auto
    then ran sd@g3 at 12 % below sd@g6 (this CPU, `apps.bench --methods sd,auto
    --gammas 4,5,6`)."""

    def __init__(self):
        self.risk = np.zeros(64)  # steps with A ≥ j whose window could show A ≥ j + 1
        self.survived = np.zeros(64)  # of those, the steps with A ≥ j + 1

    def add(self, accepted, gamma: int) -> None:
        """One run's A per step at window γ (the last, token-budget-cut step left out)."""
        g = min(int(gamma), len(self.risk))
        for a in accepted:
            a = min(max(int(a), 0), g)
            self.risk[: min(a + 1, g)] += 1
            self.survived[:a] += 1

    def hazards(self) -> np.ndarray:
        """h_j, each shrunk toward h_{j-1} (h_0 toward the pooled acceptance) with the weight
        of HAZARD_PRIOR steps: where few steps reach position j, the estimate carries the
        last well-seen hazard forward. Not the pooled mean: acceptance comes in runs, so the
        hazard grows with j, and with the tail shrunk toward the mean auto ran sd@g4 at
        T = 1 on this CPU, 4 % behind sd@g6 (`apps.bench --methods sd,mirror,auto --gammas
        4,6 --temps 0,1 --samples 2`)."""
        seen = self.risk.sum()
        prior = self.survived.sum() / seen if seen else 0.5
        h = np.empty(len(self.risk))
        for j in range(len(h)):
            w = self.risk[j] + HAZARD_PRIOR
            h[j] = (self.survived[j] + HAZARD_PRIOR * prior) / w if w > 0 else prior
            prior = h[j]
        return h

    def taus(self, gammas) -> dict[int, float]:
        reach = np.cumprod(self.hazards())  # P(A ≥ k) for k = 1, 2, ...
        return {g: 1.0 + float(reach[: min(g, len(reach))].sum()) for g in gammas}


def run_lengths(target, draft, sampling) -> RunLengths:
    """This pair's pooled RunLengths for `sampling`'s regime (one per process)."""
    key = ("runs", id(target), id(draft), sampling.temp, sampling.top_p, sampling.top_k)
    return memo.CACHE.setdefault(key, RunLengths())


def observe_run(target, draft, sampling, accept_lengths, gamma: int) -> None:
    """Pool a finished sd or mirror run's steps (committed tokens per step, A + 1) into the
    pair's RunLengths, so the next τ(γ) reads every prompt seen so far, not only the first."""
    acc = list(accept_lengths)[:-1]  # the last step is cut by the token budget
    if acc and gamma:
        run_lengths(target, draft, sampling).add([max(0, int(c) - 1) for c in acc], gamma)


def pair_taus(target, draft, ids: list[int], *, gammas, sampling) -> dict[int, float]:
    """E[τ] per γ from the pair's pooled RunLengths: on first use seeded by one sd run at the
    largest γ on `ids` (a step that accepted A of γ_max would have accepted min(A, γ) of γ),
    then fed by every run auto observes (observe_run). Acceptance comes in runs (a
    predictable stretch accepts whole windows), which one i.i.d. α misses: on the embedded
    pair τ(6)/τ(4) is 1.20 measured, 1.09-1.16 from an α."""
    from runtime.decoding import make_steps, run

    top = max(gammas)
    key = ("taus", id(target), id(draft), top, sampling.temp, sampling.top_p, sampling.top_k)
    if key not in memo.CACHE:
        n = max(1, min(JOINT_RUN_TOKENS, target.config.max_context - len(ids) - top - 2))
        r = run(
            make_steps("sd", target, draft, ids, max_new=n, sampling=sampling, seed=0, gamma=top),
            max_new=n,
        )
        observe_run(target, draft, sampling, r.stats.accept_lengths, top)
        memo.CACHE[key] = True
    return run_lengths(target, draft, sampling).taus(gammas)


def pair_acceptance(target, draft, ids: list[int], *, gamma: int, sampling) -> float:
    """α from a RUN_TOKENS-token sd run on `ids` (module docstring); cached per pair."""
    from runtime.decoding import make_steps, run

    key = (id(target), id(draft), gamma, sampling.temp, sampling.top_p, sampling.top_k)
    if key not in memo.ALPHA:
        n = max(1, min(RUN_TOKENS, target.config.max_context - len(ids) - gamma - 2))
        r = run(
            make_steps("sd", target, draft, ids, max_new=n, sampling=sampling, seed=0, gamma=gamma),
            max_new=n,
        )
        per_step = sum(r.stats.accept_lengths) / max(1, len(r.stats.accept_lengths))
        memo.ALPHA[key] = alpha_for(per_step, gamma)
    return memo.ALPHA[key]


def prompt_hits(
    target,
    draft,
    ids: list[int],
    *,
    sampling,
    kappa: int,
    exit_layer: int | None,
    target_cache=None,
    draft_cache=None,
    draft_branches: int = 0,
    exit_head: str | None = None,
) -> tuple[list[float], list[float]]:
    """How often a correction is a branch's first token, from one pass of each model over
    the prompt.

    At each of the last positions where the draft's greedy token differs from the target's
    (a rejection), whether the target's token is a branch candidate: in the exit layer's
    top-κ (eq. 9, through the exit head mirror would use: `exit_head` as --exit-head) or
    among the draft's `draft_branches` runner-ups. At T > 0 the step is simulated instead,
    the early exit's candidates coupled to the verifier's noise as mirror does it
    (_sampled_hits). The passes are the prompt's prefill: given (empty) caches, they are left
    holding the prompt, so the method chosen next does not prefill it again. Returns (hits,
    own hits), one 0/1 per rejection: own, a correction among the draft's own runner-ups,
    whose branches the worker rolls out before the early exit arrives."""
    from kernels.topk_channel import top_rows, topk_message
    from runtime.mirror.exit_head import resolve_exit_head

    x = np.array([ids])
    tc = target_cache if target_cache is not None else target.new_cache()
    dc = draft_cache if draft_cache is not None else draft.new_cache()
    exit_logits = None
    hits, own_hits = [], []
    if exit_layer is not None and getattr(target, "supports_layer_range", False):
        h = target.forward_layers(x, tc, 0, exit_layer)
        tuned = resolve_exit_head(target, exit_layer, exit_head)
        h_exit = h[:, -OMEGA_POSITIONS:]
        exit_logits = target.head(h_exit if tuned is None else tuned.apply(h_exit))[0]  # eq. 6
        h = target.forward_layers(h, tc, exit_layer, target.config.num_layers)
        tl = target.head(h[:, -OMEGA_POSITIONS:])[0]  # only the positions Ω̂ reads
    else:
        tl = target.forward(x, tc)[0]  # (T, V)
    dl = draft.forward(x, dc)[0]  # the draft's pass is its prefill
    if exit_logits is not None and (sampling is None or sampling.greedy):
        n = len(exit_logits)
        want, drafted = tl[-n:].argmax(-1), dl[-n:].argmax(-1)
        rej = np.flatnonzero(want != drafted)  # rejected: the target's token is the correction
        # the message and the runner-ups at those rows only: at V = 151,936 the 32 rows' top-κ
        # cost 120 and 100 ms a prompt (',real-vocab' emulation), most of it at accepted rows
        ids_k = topk_message(exit_logits[rej], kappa)[0] if rej.size else None
        own = top_rows(dl[-n:][rej], 1 + draft_branches) if rej.size else None
        for i, c in enumerate(want[rej].tolist()):
            hits.append(float(c in ids_k[i] or c in own[i, 1:]))
            own_hits.append(float(c in own[i, 1:]))
    elif exit_logits is not None:
        n = len(exit_logits)
        hits, own_hits = _sampled_hits(
            sampling.probs(tl[-n:]),
            sampling.probs(dl[-n:]),
            sampling.probs(exit_logits),
            kappa,
            draft_branches,
        )
    return hits, own_hits


def omega_estimate(hits, own_hits, *, draft_branches: int, pool=None) -> tuple[float, float]:
    """(Ω̂, Ω̂_own) from the prompt's hits (prompt_hits) and `pool`, the [steps, hits, own
    hits] of the mirror runs seen on this pair (branch_pool), each shrunk toward its prior
    with the weight of PRIOR_WEIGHT steps. The runs' steps count as much as the prompt's
    positions and soon outnumber them: they are what the law predicts (every step's (A, c),
    full windows' bonus tokens included) on the model's own text. On the prompt alone, auto
    put Ω̂_own at 0.35 where mirror's generations measured 0.64 (`apps.profile --emulate
    m3-max:qwen3-8b+qwen3-0.6b --temp 1 --gamma 6`) and ran mirror at γ 4, 4 % behind γ 6
    (EMULATED, `apps.bench ... --methods sd,mirror,auto --gammas 4,6 --temps 1`)."""
    steps, any_hits, own = pool if pool is not None else (0, 0, 0)
    n = len(hits) + steps + PRIOR_WEIGHT
    omega = (sum(hits) + any_hits + PRIOR_WEIGHT * PRIOR_OMEGA) / n
    if not draft_branches:
        return omega, 0.0
    return omega, min(omega, (sum(own_hits) + own + PRIOR_WEIGHT * PRIOR_OMEGA / 2) / n)


def branch_pool(target, draft, sampling, kappa: int, own_rows: int) -> list[int]:
    """[steps, hits, own hits]: the mirror steps seen on this pair in this sampling regime with
    this channel width and own-branch count, how many had (A, c) among its candidates (own
    or the early exit's top-κ), and how many among the draft's own (one per process)."""
    key = ("branches", id(target), id(draft), kappa, own_rows, sampling.temp, sampling.top_p,
           sampling.top_k)  # fmt: skip
    return memo.CACHE.setdefault(key, [0, 0, 0])


def observe_branches(target, draft, sampling, branch_hits, *, kappa: int, own_rows: int) -> None:
    """Pool a mirror run's per-step branch_hit ("own", "exit", "miss"; None: unknown) into
    the pair's branch_pool, which the next Ω̂ reads (omega_estimate)."""
    seen = [h for h in branch_hits or () if h is not None]
    if seen:
        pool = branch_pool(target, draft, sampling, kappa, own_rows)
        pool[0] += len(seen)
        pool[1] += sum(h != "miss" for h in seen)
        pool[2] += sum(h == "own" for h in seen)


SAMPLED_DRAWS = 4  # per probe position at T > 0


def _sampled_hits(p, q, proxy, kappa: int, m: int) -> tuple[list[float], list[float]]:
    """At T > 0, mirror's step at each position, simulated: the draft samples d ~ q, the
    verifier accepts with u·q(d) < p(d) (u ~ U[0, 1)), else its correction is the Gumbel-max
    draw from the residual max(p − q, 0) under noise G; the early exit sends d and the κ − 1
    tokens maximising log p̃ + G (runtime/mirror/coupled.py), the draft its own m maximising
    log q + G (coupled.rank_own_coupled, per position). A hit: a rejection whose correction is
    among them. Returns (hits, own hits): the second counts the corrections among the
    draft's own."""
    rng = np.random.default_rng(0)
    hits, own_hits = [], []
    with np.errstate(divide="ignore"):
        for t in range(len(p)):
            lp_proxy, resid = np.log(proxy[t]), np.log(np.maximum(p[t] - q[t], 0.0))
            lq = np.log(q[t])
            cdf = np.cumsum(q[t], dtype=np.float64)
            for _ in range(SAMPLED_DRAWS):
                d = min(
                    int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1
                )
                if rng.random() * q[t, d] < p[t, d]:
                    continue  # accepted: no correction here
                g = -np.log(rng.standard_exponential(q.shape[-1]))  # Gumbel (events.step_noise)
                c = int(np.argmax(resid + g))
                sent = _winners(lp_proxy + g, d, kappa - 1)
                mine = c in _winners(lq + g, d, m)
                hits.append(float(c in sent or mine))
                own_hits.append(float(mine))
    return hits, own_hits


def _winners(score: np.ndarray, drafted: int, k: int) -> np.ndarray:
    """The k highest-scoring tokens other than the drafted one (a coupled message's row)."""
    if k < 1:
        return np.zeros(0, np.int64)
    score[drafted] = -np.inf
    return np.argpartition(-score, k - 1)[:k]
