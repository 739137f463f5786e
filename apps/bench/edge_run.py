"""One flexspec generation for the edge benches, and the skip figures pooled over runs.

apps/bench/edge.py (K against cloud-only) and apps/bench/edge_codecs.py (the uplink codecs)
both run generations through `one_run`, a prompt over a named link as the flags set it through
`run_on_link`; `skip_totals` pools CU-HLM's skip rate and measured risk over them.
"""

from __future__ import annotations

import time


def one_run(
    conn_factory,
    draft,
    prompt,
    n,
    sampling,
    seed,
    k,
    eos,
    codec=None,
    params=None,
    skip=None,
    target=None,
    k_max=8,
    bit_budget=None,
    k_min=1,
):
    """(tokens, wall seconds, edge summary) of one flexspec generation; k None = adaptive (eq.
    (11) over [k_min, k_max]: k_min 0 lets it choose rounds that draft nothing).
    `codec` (and its `params`) is the uplink payload: --codec, or ids at T = 0 and raw above.
    `skip` (a SkipRule): CU-HLM's LOSSY skipping; the summary's `skip` then holds the skip rate
    and the rejection risk R measured against `target` (runtime/edge/skip.py). `bit_budget`:
    SQS §4's per-round budget (k-sqs, c-sqs), which sets each round's length up to k or k_max."""
    from types import SimpleNamespace

    from devices.kstar import AdaptiveK
    from runtime.edge.loop import edge_summary
    from runtime.session import GenerationSession

    conn = conn_factory()  # (the codec is checked against every temperature before any run)
    try:
        events = []
        options = {
            "conn": conn,
            "k": k,
            "k_max": k_max,
            "bit_budget": bit_budget,
            "controller": AdaptiveK(k_min=k_min) if k is None else None,
            "codec": codec or ("ids" if sampling.greedy else "raw"),
            "codec_params": params,
            "skip": skip,
        }
        # the verifier holds the target: the draft stands in for its config; the skip audit
        # below runs after the timed run (summarize=False)
        pair = SimpleNamespace(target=draft, draft=draft, tokenizer=None)
        session = GenerationSession(
            pair, method="flexspec", options=options, eos=eos, summarize=False
        )
        t0, v0 = time.perf_counter(), getattr(conn.link, "virtual_s", 0.0)
        toks = []
        for r in session.stream(prompt, n, sampling=sampling, seed=seed):
            toks += r.tokens
            events.append(r.step)
        # measured compute and socket time + the link's waits (slept, or on its virtual clock)
        wall = time.perf_counter() - t0 + getattr(conn.link, "virtual_s", 0.0) - v0
    finally:
        conn.close()
    summary = edge_summary(events)
    if skip is not None:
        from runtime.edge.skip import audit, skip_summary, skipped_positions

        pos, xs = skipped_positions(events, len(prompt), len(toks))
        betas = audit(target, list(prompt) + toks, pos, xs, sampling)
        summary["skip"] = skip_summary(events, skip, len(toks), betas)
    return toks, wall, summary


def run_on_link(a, pair, server: tuple, link: str, i: int, prompt, temp: float, **kw):
    """`one_run` of prompt `i` at temperature `temp` against the verifier at `server` (host,
    port, token) over the emulated `link`, its fading seeded by prompt i (the same for every
    method); the new tokens, top-p and seed as the flags `a` set them. `kw`: one_run's codec,
    params, skip, k, k_min, k_max, bit_budget."""
    from devices.links import emulator
    from runtime.decoding import Sampling
    from runtime.edge.client import Connection

    host, port, token = server

    def factory():
        return Connection(
            host, port, token, link=emulator(link, a.link_seed + i, a.link_clock == "virtual")
        )

    sampling = Sampling(temp, a.top_p)
    kw |= {"eos": pair.target.config.eos_token_ids, "target": pair.target}
    return one_run(factory, pair.draft, prompt, a.max_tokens, sampling, a.seed + i, **kw)


def skip_totals(skips: list[dict]) -> dict:
    """Skip rate and measured R (runtime/edge/skip.py) pooled over runs, by output token."""
    n = sum(s["output_tokens"] for s in skips) or 1
    out = {"skip_rate": sum(s["skipped"] for s in skips) / n,
           "u_th": skips[0]["u_th"] if skips else None,
           "theorem1_bound": max((s.get("theorem1_bound") or 0.0 for s in skips),
                                 default=None)}  # fmt: skip
    if all(s["measured_risk"] is not None for s in skips):
        out["measured_risk"] = sum(s["measured_risk"] * s["output_tokens"] for s in skips) / n
    return out
