"""`python -m apps.train.eagle_eval`: a fitted head's tokens per step and speed on held-out chat.

    nice -n 10 python -m apps.train.eagle_eval --target smollm2-135m-instruct --per-category 2

For each held-out prompt (apps/prompts/chat, first turn, the target's chat template), `ar` and
`sd` with `--draft head` at γ `--gamma`, greedy, alternated prompt by prompt in one process
(both on the same target: PyTorch, or `--target-backend onnx`; `--draft head+suffix`: the head
with the suffix draft beside it, runtime/drafts/mixed.py); prints per category and
overall: tokens per sd step (the committed tokens over the steps, A + 1 per step), the share
of drafted tokens accepted, each method's tokens/s and sd's speedup over ar, whether sd's
tokens equal ar's, and how well the head's confidence in a drafted token (its max q) predicts
that the target accepts it. One JSON object with `--json`. The fuller comparison against
peers is `apps.bench --prompts chat`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

from apps.bench.prompt_set import add_sample_args
from runtime.cli_parser import doc_parser


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.train.eagle_eval", __doc__)
    ap.add_argument("--target", required=True)
    add_sample_args(ap)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None, help="target threads (default: all)")
    ap.add_argument(
        "--target-backend",
        choices=("torch", "onnx"),
        default="torch",
        help="the PyTorch target (float32, as the head was fitted on) or the ONNX "
        "one (int4, as `generate` runs a GGUF-sourced target)",
    )
    ap.add_argument(
        "--draft-backend",
        choices=("torch", "onnx"),
        default=None,
        help="where the head steps (default: ONNX Runtime, int8 weights)",
    )
    ap.add_argument(
        "--draft",
        default="head",
        help="head (default), or head+suffix / head+lookup: the text's chain when it "
        "predicts well, else the head's (runtime/drafts/mixed.py)",
    )
    ap.add_argument(
        "--mix-min-len",
        type=int,
        default=None,
        help="a mixed draft's bar: the text's chain needs this many tokens",
    )
    ap.add_argument(
        "--mix-min-score",
        type=float,
        default=None,
        help="... and this sum of their estimated chances",
    )
    ap.add_argument(
        "--stop-below",
        type=float,
        default=None,
        help="end the head's chain once the chance that all its drafts are accepted "
        "(the product of their max q) falls below this (default: the head's own)",
    )
    ap.add_argument("--json", action="store_true")
    return ap


class Confidence:
    """The head's confidence (max q) in each token it drafts, paired with whether the target
    accepted it: drafts 1..A of a step were accepted, draft A + 1 rejected, later ones never
    judged. Reliability bins say whether q predicts acceptance (what trees need)."""

    EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.01)

    def __init__(self, draft):
        import numpy as np

        self.rows, self.pairs, real = [], [], draft.forward

        def forward(tokens, cache, **kw):
            out = real(tokens, cache, **kw)
            z = out[0, -1].astype(np.float64)
            self.rows.append(float(1.0 / np.exp(z - z.max()).sum()))
            return out

        draft.forward = forward

    def observe(self, ev) -> None:
        """Pair step `ev`'s drafts (the rows recorded since the last step) with their verdicts."""
        qs, self.rows = self.rows[-ev.drafted :] if ev.drafted else [], []
        self.pairs += [(q, j < ev.accepted) for j, q in enumerate(qs) if j <= ev.accepted]

    def table(self) -> list[dict]:
        out = []
        for lo, hi in zip(self.EDGES, self.EDGES[1:], strict=False):
            got = [ok for q, ok in self.pairs if lo <= q < hi]
            mean_q = [q for q, _ in self.pairs if lo <= q < hi]
            if got:
                out.append(
                    {
                        "q": f"{lo:.1f}-{min(hi, 1):.1f}",
                        "n": len(got),
                        "mean_q": round(sum(mean_q) / len(got), 3),
                        "accepted": round(sum(got) / len(got), 3),
                    }
                )
        return out


def answer(session, ids: list[int], max_tokens: int, conf: Confidence | None = None):
    """One greedy answer of `session` as a runtime.decoding.Generated; its wall_s is the whole
    turn, stream and close (as runtime.decoding.run timed it). `conf` sees each step."""
    from runtime.decoding import Generated
    from runtime.decoding.events import GREEDY

    out, t0 = [], time.perf_counter()
    for r in session.stream(ids, max_tokens, sampling=GREEDY, seed=0):
        out += r.tokens
        if conf is not None:
            conf.observe(r.step)
    r.stats.wall_s = time.perf_counter() - t0
    return Generated(out, r.stats, r.finish)


def main(argv=None) -> int:
    from apps.bench.prompt_set import sample_prompts, turn_ids
    from runtime.chat_template import ChatTemplate
    from runtime.drafts.mixed import is_mixed_spec
    from runtime.errors import DuetError
    from runtime.loading import load_pair
    from runtime.session import GenerationSession

    a = build_parser().parse_args(argv)
    if a.draft != "head" and not is_mixed_spec(a.draft):
        raise DuetError(
            f"--draft {a.draft}: give head, or a head with a model-free draft "
            "(head+suffix, head+lookup)"
        )
    pair = load_pair(
        a.target,
        a.draft,
        need_draft=True,
        target_backend=a.target_backend,
        target_threads=a.threads,
        draft_backend=a.draft_backend,
    )
    mixed = getattr(pair.draft, "mixed", False)
    if mixed and a.mix_min_len is not None:
        pair.draft.min_len = a.mix_min_len
    if mixed and a.mix_min_score is not None:
        pair.draft.min_score = a.mix_min_score
    head = pair.draft.model if mixed else pair.draft
    if a.stop_below is not None:
        head.stop_below = a.stop_below
    template = ChatTemplate.load(pair.target_dir)
    recs = sample_prompts(a)
    eos = pair.target.config.eos_token_ids
    conf = Confidence(head)
    sessions = {
        m: GenerationSession(pair, method=m, options={"gamma": a.gamma}, eos=eos, summarize=False)
        for m in ("ar", "sd")
    }
    cats: dict = defaultdict(lambda: defaultdict(float))
    for rec in recs:
        ids = turn_ids(pair.tokenizer, template, rec["turns"][:1], [])
        got = {}
        for method, session in sessions.items():
            conf.rows = []
            got[method] = answer(session, ids, a.max_tokens, conf if method == "sd" else None)
        for key in (rec["category"], "all"):
            c, s, r = cats[key], got["sd"].stats, got["ar"].stats
            c["prompts"] += 1
            c["sd_tokens"] += s.new_tokens
            c["sd_steps"] += len(s.accept_lengths)
            c["accepted"] += sum(s.accepted)
            c["drafted"] += sum(s.drafted)
            c["sd_s"] += s.wall_s
            c["ar_tokens"] += r.new_tokens
            c["ar_s"] += r.wall_s
            c["equal"] += got["sd"].tokens == got["ar"].tokens
        print(
            f"{rec['category']:>15} q{rec['question_id']}: {got['sd'].stats.new_tokens} tokens "
            f"in {len(got['sd'].stats.accept_lengths)} sd steps",
            flush=True,
        )
    rows = {
        k: {
            "prompts": int(c["prompts"]),
            "tokens_per_step": round(c["sd_tokens"] / max(1, c["sd_steps"]), 3),
            "accept_rate": round(c["accepted"] / max(1, c["drafted"]), 3),
            "ar_tok_s": round(c["ar_tokens"] / max(1e-9, c["ar_s"]), 2),
            "sd_tok_s": round(c["sd_tokens"] / max(1e-9, c["sd_s"]), 2),
            "speedup": round((c["sd_tokens"] / c["sd_s"]) / (c["ar_tokens"] / c["ar_s"]), 3),
            "greedy_equals_ar": f"{int(c['equal'])}/{int(c['prompts'])}",
        }
        for k, c in cats.items()
    }
    out = {"target": str(pair.target_dir), "draft": a.draft, "gamma": a.gamma,
           "stop_below": getattr(head, "stop_below", 0.0),
           "max_tokens": a.max_tokens, "settings": pair.settings, "rows": rows,
           "calibration": conf.table()}  # fmt: skip
    if mixed:  # which draft drafted the sd steps (the text's chains carry no confidence row)
        out["mixed"] = {"min_len": pair.draft.min_len, "min_score": pair.draft.min_score,
                        "text_steps": pair.draft.free_steps,
                        "head_steps": pair.draft.model_steps}  # fmt: skip
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, r in rows.items():
            print(f"{k:>15}: {r}")
        if mixed:
            print(f"mixed draft: {out['mixed']}")
        for r in out["calibration"]:
            print(
                f"draft confidence {r['q']}: {r['n']} drafts, mean q {r['mean_q']}, "
                f"accepted {r['accepted']}"
            )
    return 0


if __name__ == "__main__":
    from runtime.errors import cli_main

    raise SystemExit(cli_main(main)())
