"""One process, every method, alternated: warm-up, then round-robin per prompt.

Within a prompt the runners go in an order rotated by the prompt's index, so
slow drift (thermal, a background job) hits every method equally; each
temperature uses the same seed for every method. Greedy outputs are compared
with `ar`'s token for token (`matches_ar`); a mismatch is reported, not hidden. A runner
whose library refuses the pair leaves a record holding only its refusal text.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from .prompt_set import turn_ids


def _fit(ids: list[int], max_new: int, context: int) -> tuple[list[int], int]:
    """Keep the prompt's end so prompt + answer fit the context."""
    max_new = max(1, min(max_new, context - 1))
    return (ids[-(context - max_new) :] if len(ids) + max_new > context else ids), max_new


def run_prompt(runner, rec: dict, tok, template, *, temp, top_p, max_new, seed, context) -> dict:
    """All turns of one question through one runner: a per-prompt record."""
    eos = set(getattr(runner, "eos", ()))
    answers, tokens, walls, lengths, steps, notes = [], [], [], [], [], set()
    stages: dict | None = {}
    passes: list = []  # draft passes J per window, over the turns (sd / mirror)
    verified: int | None = 0
    for _ in rec["turns"]:
        ids, n = _fit(turn_ids(tok, template, rec["turns"], answers), max_new, context)
        r = runner.generate(ids, n, temp, top_p, seed)
        if r.refused:  # the library refused this pair: its words, no figures
            return {
                "method": runner.name,
                "temp": temp,
                "question_id": rec["question_id"],
                "category": rec["category"],
                "refused": r.refused,
                "matches_ar": None,
            }
        tokens.append(r.tokens)
        passes += [j for j in (getattr(r, "draft_passes", None) or []) if j is not None]
        walls.append(r.wall_s)
        if r.stage_s is None or stages is None:
            stages = None
        else:
            stages = {k: stages.get(k, 0.0) + v for k, v in r.stage_s.items()}
        verified = (
            None if verified is None or r.verified_tokens is None else verified + r.verified_tokens
        )
        if r.accept_lengths is None or lengths is None:
            lengths = None
            notes.add(r.note or "accepted length not observable")
        else:
            lengths += r.accept_lengths
            steps.append(len(r.accept_lengths))
            if r.note:  # e.g. what `auto` picked for this prompt, and why
                notes.add(r.note)
        answers.append(tok.decode([t for t in r.tokens if t not in eos]))
    return {
        "method": runner.name,
        "temp": temp,
        "question_id": rec["question_id"],
        "category": rec["category"],
        "turns": answers,
        "tokens": tokens,
        "new_tokens": [len(t) for t in tokens],
        "wall_time": walls,
        "decoding_steps": None if lengths is None else steps,
        "accept_lengths": lengths,
        "note": "; ".join(sorted(notes)) or None,
        "stage_s": stages,
        "verified_tokens": verified,
        "draft_passes": passes or None,
        "matches_ar": None,
    }


def run_bench(
    runners: list,
    prompts: list[dict],
    tok,
    template,
    *,
    temps: list[float],
    top_p: float,
    max_new: int,
    seed: int,
    context: int,
    warmup: bool = True,
    samples: int = 1,
    rounds: int = 1,
) -> list[dict]:
    """Per-prompt records for every (runner, temperature), methods alternated.

    At T > 0 each prompt runs `samples` times, draw k with seed + i + k·len(prompts) (the
    record's "sample"): a T > 0 run's Calls and τ depend on which text was drawn, so one draw
    per prompt compares methods on different texts; more draws average that out. `rounds`
    repeats the whole schedule (the record's "round"; the same texts, the runner order
    rotated one further each round): the rows pool every round's time, so a machine's noise
    and drift, ±6 % between two runners doing identical work in one round on a 2-core CPU,
    average out where a goal is a few percent."""
    kw = dict(top_p=top_p, context=context)
    if warmup:  # first calls pay for graph building, allocations, lazy imports
        first = {**prompts[0], "turns": prompts[0]["turns"][:1]}
        for t in temps:
            for r in runners:
                run_prompt(
                    r, first, tok, template, temp=t, max_new=min(max_new, 8), seed=seed, **kw
                )
    records = []
    bar = tqdm(
        total=len(prompts) * rounds, desc="bench", unit="prompt", file=sys.stderr, disable=None
    )
    for rnd, i, rec in ((r, i, p) for r in range(rounds) for i, p in enumerate(prompts)):
        bar.update(1)
        j = (i + rnd) % len(runners)
        order = runners[j:] + runners[:j]
        for t in temps:
            for k in range(1 if t == 0 else samples):  # greedy output is one text
                s = seed + i + k * len(prompts)
                done = {
                    r.name: run_prompt(r, rec, tok, template, temp=t, max_new=max_new, seed=s, **kw)
                    | {"sample": k, "round": rnd}
                    for r in order
                }
                for r in order:  # each against its own ar: Duet's `ar`, a peer's (peers.py)
                    own = done[r.name]["own_ar"] = getattr(r, "own_ar", "ar")
                    d, base = done[r.name], done.get(own)
                    if t == 0 and base is not None and "refused" not in d and "refused" not in base:
                        d["matches_ar"] = d["tokens"] == base["tokens"]
                records += [done[r.name] for r in runners]
    bar.close()
    return records
