"""The rows of `python -m apps.bench evolving`: each draft's acceptance on each target, and
its end-to-end ms/token (apps/bench/evolving_e2e.py).

`run` checks the drafts the flags name, starts the verifiers once, and gathers every target's
rows; a target's rows load the pair per draft, on the PyTorch backend for the target.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from runtime.decoding import Sampling
from runtime.errors import DuetError
from runtime.loading import load_pair
from runtime.session import GenerationSession

from .evolving_setup import BASE, ROOT, domain_prompts, setup, targets


def acceptance(pair, prompts, temp: float, max_new: int, gamma: int) -> float:
    """Accepted / drafted draft tokens of `sd` over all prompts (prompt i seeded i)."""
    # eos=(): every prompt runs its max_new tokens (no EOS cut), as the table was measured
    session = GenerationSession(
        pair, method="sd", options={"gamma": gamma}, eos=(), summarize=False
    )
    acc = drafted = 0
    for i, ids in enumerate(prompts):
        stats = None
        for r in session.stream(ids, max_new, sampling=Sampling(temp), seed=i):
            stats = r.stats
        acc += sum(stats.accepted)
        drafted += sum(stats.drafted)
    return acc / drafted if drafted else float("nan")


def run(a: argparse.Namespace) -> dict:
    s = setup(a.base, a.evolved, a.generic)
    if not (s.anchor / "anchor.json").is_file():
        raise DuetError(
            f"no anchor draft at {s.anchor}; train it with python -m apps.train "
            f"anchor --base {a.base or BASE.relative_to(ROOT)} --out {s.anchor}"
        )
    if not (s.generic / "config.json").is_file():
        raise DuetError(f"--generic {s.generic}: not a checkpoint directory (no config.json)")
    from apps.bench.evolving_e2e import Verifiers

    drafts = {"generic": s.generic, "anchor": s.anchor}
    for abl in sorted(s.evolved.glob("anchor?*")):  # ablations (--keep-first), named by folder
        if (abl / "anchor.json").is_file():
            drafts[abl.name] = abl
    if a.head:
        from runtime.drafts.head.torch import head_sidecar

        if not (head_sidecar(s.base) / "head.json").is_file():
            raise DuetError(
                f"--head: {s.base} has no fitted head ({head_sidecar(s.base)}); "
                f"fit one with python -m apps.train eagle --help"
            )
        drafts["head"] = "head"
    if a.drafts:
        want = a.drafts.split(",")
        if unknown := [d for d in want if d not in drafts]:
            raise DuetError(
                f"--drafts {','.join(unknown)}: not found; this run has {', '.join(drafts)}"
            )
        drafts = {d: drafts[d] for d in want}
    rows, t0 = [], time.monotonic()
    tlist = targets(s, not a.no_controls)
    lora = {t["adapter"].name: t["adapter"] for t in tlist if t["adapter"] is not None}
    verifiers = Verifiers({s.base: lora}, a.threads)
    try:
        for t in tlist:
            rows.extend(target_rows(a, t, drafts, verifiers, s.base))
    finally:
        verifiers.stop()
    settings = {"base": str(s.base), "evolved": str(s.evolved), "generic": str(s.generic),
                "method": "sd", "gamma": a.gamma, "prompts_per_target": a.prompts,
                "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens,
                "e2e": {"method": "flexspec", "link": a.link, "link_clock": "virtual",
                        "k": a.k if a.k is not None else "adaptive K* (eq. 11)", "codec": "ids",
                        "temp": 0, "threads": a.threads,
                        "ms_per_token": "emulated link time + measured compute"},
                "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    return {"rows": rows, "settings": settings}


def target_rows(a: argparse.Namespace, t: dict, drafts: dict, verifiers, base: Path):
    """The rows of one target: acceptance of each draft, then its end-to-end ms/token."""
    from apps.bench.evolving_e2e import ms_per_token

    prompts = None
    for dname, dpath in drafts.items():
        head = dpath == "head"  # the base's head, PyTorch: it reads this target's own weights
        pair = load_pair(
            str(t["dir"]),
            str(dpath),
            need_draft=True,
            target_backend="torch",
            adapter=str(t["adapter"]) if t["adapter"] else None,
            target_threads=a.threads,
            heads_from=base if head else None,
            draft_backend="torch" if head else None,
        )
        if prompts is None:
            prompts = domain_prompts(t["domain"], pair.tokenizer, a.prompts, a.prompt_tokens)
        row = {"draft": dname, "target": t["name"], "prompts": t["domain"]}
        for key, temp in (("acceptance_greedy", 0.0), ("acceptance_t1", 1.0)):
            row[key] = round(acceptance(pair, prompts, temp, a.max_tokens, a.gamma), 4)
        row["ms_per_token"] = None
        if a.link == "none":
            row["ms_per_token_reason"] = "--link none: no link to measure over"
        elif head:
            row["ms_per_token_reason"] = "the head drafts from the target's features: no edge run"
        else:  # the verifier of t's base, the session naming t's adapter
            row.update(
                ms_per_token(
                    verifiers,
                    Path(t["dir"]),
                    t["adapter"].name if t["adapter"] else "",
                    pair.draft,
                    prompts,
                    link=a.link,
                    max_new=a.max_tokens,
                    k=a.k,
                    eos=pair.target.config.eos_token_ids,
                )
            )
        print(
            f"{dname:8s} {t['name']:22s} {t['domain']:13s} greedy {row['acceptance_greedy']:.3f} "
            f"T=1 {row['acceptance_t1']:.3f} e2e {row['ms_per_token']} ms/tok",
            file=sys.stderr,
            flush=True,
        )
        yield row
