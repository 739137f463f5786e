"""The summary a reader compares: per method and temperature, tokens/s, accepted length, speedup.

tokens/s is total new tokens over total wall time (prefill included) across
prompts; mean accepted length is the mean of every step's committed tokens, as
Spec-Bench reports it; speedup is over `ar` at the same temperature. A baseline whose
library refused the pair gets a row with its refusal text and no figures.
"""

from __future__ import annotations


def summarize(
    records: list[dict], methods: list[str], temps: list[float], own_ar: dict | None = None
) -> list[dict]:
    """Rows per (method, temperature); a method's speedup is over `own_ar[method]` (a peer's own
    ar, apps/bench/runners/peers.py), else over `ar`."""
    rows = []
    for t in temps:
        tps_of: dict[str, float] = {}
        for m in methods:
            rs = [r for r in records if r["method"] == m and r["temp"] == t]
            if not rs:
                continue
            if any("refused" in r for r in rs):  # the library's words instead of a number
                why = next(r["refused"] for r in rs if "refused" in r)
                rows.append(
                    {
                        "method": m,
                        "temp": t,
                        "prompts": len(rs),
                        "refused": why,
                        "tokens_per_s": None,
                        "mean_accepted": None,
                        "speedup": None,
                        "matches_ar": None,
                    }
                )
                continue
            toks = sum(sum(r["new_tokens"]) for r in rs)
            wall = sum(sum(r["wall_time"]) for r in rs)
            tps = toks / wall if wall > 0 else 0.0
            observed = all(r["accept_lengths"] is not None for r in rs)
            lengths = [x for r in rs for x in (r["accept_lengths"] or [])]
            tps_of[m] = tps
            matches = [r["matches_ar"] for r in rs if r["matches_ar"] is not None]
            rows.append(
                {
                    "method": m,
                    "temp": t,
                    "prompts": len(rs),
                    "new_tokens": toks,
                    "wall_s": round(wall, 4),
                    "tokens_per_s": round(tps, 2),
                    "mean_accepted": round(sum(lengths) / len(lengths), 3)
                    if observed and lengths
                    else None,
                    "mean_accepted_note": None
                    if observed
                    else next(r["note"] for r in rs if r["note"]),
                    "speedup": None,  # below, once every method's rate is known
                    "matches_ar": f"{sum(matches)}/{len(matches)}" if matches else None,
                }
                | calls_and_tokens(rs)
                | step_split(rs)
                | draft_share(rs)
                | draft_passes(rs)
            )
        at_t = {r["method"]: r for r in rows if r["temp"] == t}
        for m, r in at_t.items():
            base = tps_of.get((own_ar or {}).get(m, "ar"))
            if m in tps_of and base:
                r["speedup"] = round(tps_of[m] / base, 3)
        for r in at_t.values():  # mirror@g4 against sd@g4, tree+X against sd+X (same suffix)
            for ours, theirs in (("mirror", "sd"), ("tree", "sd"), ("heterospec", "tree")):
                other = at_t.get(partner(r["method"], ours, theirs))
                if other and other.get("tokens_per_s") and r.get("tokens_per_s") is not None:
                    r[f"vs_{theirs}"] = round(r["tokens_per_s"] / other["tokens_per_s"], 3)
                    if t > 0 and ours == "mirror":  # keyed streams: sd's texts, for a seed
                        r["same_texts_as_sd"] = same_texts(records, r["method"], other["method"], t)
    return rows


def same_texts(records: list[dict], a: str, b: str, temp: float) -> str:
    """How many turns runners a and b answered with the same tokens at `temp`, "k/n": sampled
    sd and mirror draw from the same keyed streams (runtime/decoding/events.py), so at one γ
    and seed their ratio is measured on the same texts, up to the rare draw that the draft's
    batched and single-row passes round apart."""
    tok = {
        (r["method"], r["question_id"], r.get("sample", 0), r.get("round", 0)): r.get("tokens")
        for r in records
        if r["temp"] == temp
    }
    same = n = 0
    for (m, *draw), ts in tok.items():
        other = tok.get((b, *draw))
        if m != a or ts is None or other is None:
            continue
        n += len(ts)
        same += sum(x == y for x, y in zip(ts, other, strict=False))
    return f"{same}/{n}"


def base_method(name: str) -> str:
    """The method of a runner name: `sd` for `sd`, `sd+mtp`, `sd@g4` (apps/bench/drafts.py,
    --gammas)."""
    return name.split("+")[0].split("@")[0]


def partner(name: str, ours: str, theirs: str) -> str | None:
    """The `theirs` runner with `name`'s draft and γ suffix, when `name` is an `ours` runner."""
    return theirs + name[len(ours) :] if base_method(name) == ours else None


def calls_and_tokens(rs: list[dict]) -> dict:
    """HeteroSpec's device-independent costs over the prompts: target calls (Calls: one per
    decoding step) and the tokens those calls verified (Tokens), when the method reports them."""
    if any(r.get("decoding_steps") is None or r.get("verified_tokens") is None for r in rs):
        return {}
    return {
        "calls": sum(sum(r["decoding_steps"]) for r in rs),
        "verified_tokens": sum(r["verified_tokens"] for r in rs),
    }


def step_split(rs: list[dict]) -> dict:
    """Per decoding step, the milliseconds spent drafting and verifying (Duet's methods)."""
    if any(r.get("stage_s") is None or r.get("decoding_steps") is None for r in rs):
        return {}
    n = sum(sum(r["decoding_steps"]) for r in rs)
    if not n:
        return {}
    return {
        f"{k}_ms_per_step": round(1e3 * sum(r["stage_s"][k] for r in rs) / n, 3)
        for k in ("draft", "verify")
    }


def tree_account(r: dict, sd: dict | None) -> str:
    """Why a tree runner is r['vs_sd'] times its sd partner: its tokens per step against its
    step time, both relative to sd's, with the step split into drafting and verifying."""
    line = f"temp {r['temp']:g}: {r['method']} is {r['vs_sd']:.2f}x {sd['method'] if sd else 'sd'}"
    if not sd or not r.get("mean_accepted") or not sd.get("mean_accepted"):
        return line
    tau = r["mean_accepted"] / sd["mean_accepted"]
    line += (
        f": {tau:.2f}x its tokens per step (τ {r['mean_accepted']:.2f} vs "
        f"{sd['mean_accepted']:.2f}) at {tau / r['vs_sd']:.2f}x its step time"
    )
    if "draft_ms_per_step" in r and "draft_ms_per_step" in sd:
        line += (
            f" (drafting {r['draft_ms_per_step']:.1f} vs {sd['draft_ms_per_step']:.1f} ms, "
            f"verifying {r['verify_ms_per_step']:.1f} vs {sd['verify_ms_per_step']:.1f} "
            "ms a step)"
        )
    return line


def draft_share(rs: list[dict]) -> dict:
    """For a draft-then-verify method: the share of its step spent drafting, and the ceiling
    it puts on Mirror-SD: hiding all of that drafting, at no cost, saves at most that share,
    so mirror / this method <= 1 / (1 - share)."""
    if base_method(rs[0]["method"]) != "sd" or any(r.get("stage_s") is None for r in rs):
        return {}
    d = sum(r["stage_s"]["draft"] for r in rs)
    v = sum(r["stage_s"]["verify"] for r in rs)
    if d + v <= 0:
        return {}
    share = d / (d + v)
    return {"draft_share": round(share, 4), "mirror_ceiling_vs_sd": round(1 / (1 - share), 3)}


def draft_passes(rs: list[dict]) -> dict:
    """J, the draft's internal passes per window (Mirror-SD App. C), when the method reports
    it: γ for an ordinary draft, fewer for a speculative-streaming one."""
    js = [j for r in rs for j in (r.get("draft_passes") or [])]
    return {"draft_passes_per_window": round(sum(js) / len(js), 3)} if js else {}


def mismatches(records: list[dict]) -> list[dict]:
    """Greedy outputs that differ from their own `ar`'s (record["own_ar"], default `ar`): where,
    and from which token on."""
    ar = {(r["method"], r["question_id"], r.get("round", 0)): r for r in records if r["temp"] == 0}
    out = []
    for r in records:
        if r["matches_ar"] is False:
            base = ar[(r.get("own_ar", "ar"), r["question_id"], r.get("round", 0))]
            a = [x for t in base["tokens"] for x in t]
            b = [x for t in r["tokens"] for x in t]
            first = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            out.append(
                {
                    "method": r["method"],
                    "own_ar": r.get("own_ar", "ar"),
                    "question_id": r["question_id"],
                    "first_diff": first,
                    "ar_tokens": len(a),
                    "tokens": len(b),
                }
            )
    return out


def table(rows: list[dict]) -> str:
    head = ["method", "temp", "tok/s", "mean acc", "speedup", "Calls", "Tokens", "= ar (greedy)"]
    body = [
        [
            r["method"],
            f"{r['temp']:g}",
            f"{r['tokens_per_s']:.1f}",
            "n/a" if r["mean_accepted"] is None else f"{r['mean_accepted']:.2f}",
            "n/a" if r["speedup"] is None else f"{r['speedup']:.2f}x",
            r.get("calls", ""),
            r.get("verified_tokens", ""),
            r["matches_ar"] or "",
        ]
        for r in rows
        if "refused" not in r
    ]
    w = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    line = lambda cells: (  # noqa: E731
        "  ".join(str(c).ljust(n) for c, n in zip(cells, w, strict=False)).rstrip()
    )
    notes = (
        [
            f"temp {r['temp']:g}: {r['method']} drafts {100 * r['draft_share']:.0f}% "
            "of each step, so "
            f"hiding all of it for free makes Mirror-SD at most {r['mirror_ceiling_vs_sd']:.2f}x "
            f"{r['method']} on this pair"
            + next(
                (
                    f" (measured {m['method']}: {m['vs_sd']:.2f}x {r['method']}"
                    + (
                        f", the same texts in {m['same_texts_as_sd']} turns"
                        if "same_texts_as_sd" in m
                        else ""
                    )
                    + ")"
                    for m in rows
                    if partner(m["method"], "mirror", "sd") == r["method"]
                    and m["temp"] == r["temp"]
                    and "vs_sd" in m
                ),
                "",
            )
            for r in rows
            if "draft_share" in r
        ]
        + [
            tree_account(
                r,
                next(
                    (
                        m
                        for m in rows
                        if m["temp"] == r["temp"]
                        and m["method"] == partner(r["method"], "tree", "sd")
                    ),
                    None,
                ),
            )
            for r in rows
            if base_method(r["method"]) == "tree" and "vs_sd" in r
        ]
        + [
            f"temp {r['temp']:g}: {r['method']} is {r['vs_tree']:.2f}x "
            f"{partner(r['method'], 'heterospec', 'tree')}"
            for r in rows
            if "vs_tree" in r
        ]
    )
    refusals = [
        line([r["method"], f"{r['temp']:g}"]) + f"  refused: {r['refused']}"
        for r in rows
        if "refused" in r
    ]
    return "\n".join(
        [line(head), line(["-" * n for n in w])] + [line(b) for b in body] + refusals + notes
    )
