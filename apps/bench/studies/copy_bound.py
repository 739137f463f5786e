"""`python -m apps.bench.studies.copy_bound`: the fastest any model-free draft could make a target's
turns, from its own greedy answers and its own measured pass costs.

    python -m apps.bench.studies.copy_bound --target smollm2-135m-instruct --per-category 2

Prompt lookup and suffix drafts propose copies of the text so far (the prompt and the answer
committed before the step). So a step at answer position i can have at most L_i drafts
accepted, L_i being the longest run a[i:i+L] that occurs in that text, and it commits k <= L_i + 1
tokens in a k-token verify pass. An oracle that knows the answer picks each step's k to
minimize the total (dynamic programming over positions), with no drafting cost, and with each
step costing an `ar` step plus what the k-token pass costs over a one-token pass, both measured
on the prompt's own context. The prefill, which no draft speeds, is measured too. The turn's
speedup over `ar` under that oracle bounds every lookup or suffix draft without a corpus
(`--draft lookup|suffix`, the target alone), at the γ ceiling given (`--max-window`);
`any_draft` bounds every draft at all: each of its windows wholly accepted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

from apps.bench.prompt_set import add_sample_args
from runtime.cli_parser import doc_parser


def copy_lengths(context: list[int], answer: list[int], cap: int) -> list[int]:
    """L_i for each answer position i: the longest L <= cap with answer[i:i+L] a contiguous
    run of context + answer[:i] (the text committed before position i)."""
    seen: list[set] = [set() for _ in range(cap + 1)]
    text: list[int] = []

    def push(t: int) -> None:
        text.append(t)
        for n in range(1, min(cap, len(text)) + 1):
            seen[n].add(tuple(text[-n:]))

    for t in context:
        push(t)
    out = []
    for i in range(len(answer)):
        n = 0
        while n < cap and i + n < len(answer) and tuple(answer[i : i + n + 1]) in seen[n + 1]:
            n += 1
        out.append(n)
        push(answer[i])
    return out


def fastest_steps(lengths: list[int], step_s) -> tuple[float, int]:
    """(seconds, steps) of the cheapest way to commit every position: a step at i commits
    k <= lengths[i] + 1 tokens for step_s(k) seconds (step_s nondecreasing in k)."""
    n = len(lengths)
    best, steps = [0.0] * (n + 1), [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best[i], steps[i] = min(
            (step_s(k) + best[i + k], steps[i + k] + 1)
            for k in range(1, min(lengths[i] + 1, n - i) + 1)
        )
    return best[0], steps[0]


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.bench.studies.copy_bound", __doc__)
    ap.add_argument("--target", required=True, help="a known model's name or a checkpoint dir")
    add_sample_args(ap)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--max-window",
        default="5,17",
        help="verify windows (γ + 1) to bound at, comma-separated (5,17)",
    )
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds per pass cost (7)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target-backend", choices=("torch", "onnx"), default="onnx")
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv=None) -> int:
    from apps.bench.prompt_set import sample_prompts, turn_ids
    from converters.onnx_target_bench import window_seconds
    from runtime.chat_template import ChatTemplate
    from runtime.decoding import make_steps, run
    from runtime.decoding.events import GREEDY
    from runtime.errors import DuetError
    from runtime.loading import load_pair

    a = build_parser().parse_args(argv)
    try:
        caps = sorted({int(w) for w in a.max_window.split(",")})
    except ValueError:
        raise DuetError(f"--max-window {a.max_window!r}: expected integers like 5,17") from None
    if not caps or caps[0] < 2:
        raise DuetError("--max-window: each window must be at least 2 (one draft)")
    pair = load_pair(
        a.target, None, need_draft=False, target_backend=a.target_backend, target_threads=a.threads
    )
    template = ChatTemplate.load(pair.target_dir)
    eos, tgt = pair.target.config.eos_token_ids, pair.target
    cats: dict = defaultdict(lambda: defaultdict(float))

    def ar(ids, n):
        t = time.perf_counter()
        out = run(
            make_steps("ar", tgt, None, ids, max_new=n, sampling=GREEDY, seed=0),
            max_new=n,
            eos_ids=eos,
            prompt_len=len(ids),
        )
        return time.perf_counter() - t, out.tokens

    for rec in sample_prompts(a):
        ids = turn_ids(pair.tokenizer, template, rec["turns"][:1], [])
        (pre1, _), (turn1, ans), (pre2, _), (turn2, _) = (ar(ids, n) for n in (1, a.max_tokens) * 2)
        pre, turn = min(pre1, pre2), min(turn1, turn2)  # the quieter of two alternated runs
        ctx = ids + ans[: len(ans) // 2]  # pass costs over the answer's middle context
        cost, _ = window_seconds(tgt, ctx, tuple(range(1, caps[-1] + 1)), a.repeats)
        ar_step = (turn - pre) / max(1, len(ans) - 1)
        lens = copy_lengths(ids + ans[:1], ans[1:], caps[-1] - 1)
        row = {"prefill_s": pre, "ar_s": turn, "tokens": len(ans)}
        # a step: an ar step plus what a k-token pass costs beyond a one-token one
        step = [0.0] + [ar_step + max(0.0, cost[k] - cost[1]) for k in range(1, caps[-1] + 1)]
        for w in caps:
            s, n = fastest_steps([min(x, w - 1) for x in lens], step.__getitem__)
            row[f"bound_s_{w}"], row[f"steps_{w}"] = pre + s, n
            s, _ = fastest_steps([w - 1] * len(lens), step.__getitem__)
            row[f"any_s_{w}"] = pre + s  # any draft, every token accepted
        for key in (rec["category"], "all"):
            for k, v in row.items():
                cats[key][k] += v
            cats[key]["prompts"] += 1
        print(
            f"{rec['category']:>15} q{rec['question_id']}: prompt {len(ids)}, {len(ans)} "
            f"tokens, prefill {pre / turn:.0%} of ar's turn",
            file=sys.stderr,
            flush=True,
        )
    rows = {}
    for k, c in cats.items():
        r = {
            "prompts": int(c["prompts"]),
            "prefill_share": round(c["prefill_s"] / c["ar_s"], 3),
        }
        for w in caps:
            r[f"bound_speedup_w{w}"] = round(c["ar_s"] / c[f"bound_s_{w}"], 3)
            r[f"any_draft_speedup_w{w}"] = round(c["ar_s"] / c[f"any_s_{w}"], 3)
            r[f"bound_tok_per_step_w{w}"] = round(
                (c["tokens"] - c["prompts"]) / max(1, c[f"steps_{w}"]), 2
            )
        rows[k] = r
    if a.json:
        print(json.dumps({"target": str(pair.target_dir), "rows": rows}, indent=2))
    else:
        for k, r in rows.items():
            print(f"{k:>15}: {r}")
    return 0


if __name__ == "__main__":
    from runtime.errors import cli_main

    raise SystemExit(cli_main(main)())
