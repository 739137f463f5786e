"""`python -m apps.bench.studies.ss_e2e`: sd and mirror with an ordinary (AR) draft and with a
speculative-streaming (SS) draft, end to end, alternating in one process.

    nice -n 10 python -m apps.bench.studies.ss_e2e --ss-draft runs/ss-draft --limit 5 \\
        --max-tokens 64

On a shared machine the load moves between runs, so the two drafts are compared prompt by
prompt: for each prompt and temperature, `ar`, then each method with the AR draft and with
the SS draft, back to back. Reported per method x draft x temperature: tokens/s (prefill
included), speedup over `ar`, mean committed tokens per step, J (draft passes per window)
and, at T = 0, whether every output equals `ar`'s. Both drafts run on the same backend.
"""

from __future__ import annotations

import json
import sys
import time

from apps.bench.args import add_temps_arg, parse_temps
from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


def one_run(method, target, draft, ids, max_new, sampling, seed, **opts) -> dict:
    from runtime.decoding import make_steps, run

    t0 = time.perf_counter()
    r = run(
        make_steps(
            method, target, draft, ids, max_new=max_new, sampling=sampling, seed=seed, **opts
        ),
        max_new=max_new,
        eos_ids=target.config.eos_token_ids,
    )
    st = r.stats.as_dict()
    return {
        "tokens": r.tokens,
        "wall": time.perf_counter() - t0,
        "lengths": st["accept_lengths"],
        "passes": [j for j in st.get("per_step", {}).get("draft_passes", []) if j],
    }


def summarize(runs: dict) -> list[dict]:
    """One row per (method, draft, temp) from the per-prompt results."""
    rows, base = [], {}
    for (m, d, t), rs in runs.items():
        tps = sum(len(r["tokens"]) for r in rs) / sum(r["wall"] for r in rs)
        if m == "ar":
            base[t] = tps
        lengths = [x for r in rs for x in r["lengths"]]
        js = [x for r in rs for x in r["passes"]]
        rows.append(
            {
                "method": m,
                "draft": d,
                "temp": t,
                "tokens_per_s": round(tps, 2),
                "mean_accepted": round(sum(lengths) / len(lengths), 3) if lengths else None,
                "draft_passes_per_window": round(sum(js) / len(js), 3) if js else None,
                "matches_ar": f"{sum(r.get('same', False) for r in rs)}/{len(rs)}"
                if t == 0 and m != "ar"
                else None,
            }
        )
    for r in rows:
        r["speedup"] = round(r["tokens_per_s"] / base[r["temp"]], 3) if r["temp"] in base else None
    return rows


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = doc_parser("python -m apps.bench.studies.ss_e2e", __doc__)
    ap.add_argument("--ss-draft", required=True, help="SS draft (apps.train ss-draft)")
    ap.add_argument("--ar-draft", default=None, help="ordinary draft (default: the embedded one)")
    ap.add_argument("--target", default=None, help="target (default: the embedded one)")
    ap.add_argument("--methods", default="sd,mirror", help="of sd, mirror (default both)")
    add_temps_arg(ap, "0,1")
    ap.add_argument("--limit", type=int, default=5, help="prompts (default 5)")
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--gamma", type=int, default=4, help="window γ (default 4)")
    ap.add_argument(
        "--backend",
        choices=["onnx", "torch"],
        default="onnx",
        help="runs both drafts (default onnx)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    methods = a.methods.split(",")
    if not set(methods) <= {"sd", "mirror"}:
        raise DuetError(f"--methods: sd and/or mirror (got {a.methods!r})")
    temps = parse_temps(a.temps)
    if a.limit < 1 or a.max_tokens < 1 or a.gamma < 1:
        raise DuetError("--limit, --max-tokens and --gamma must be >= 1")
    from apps.bench.prompt_set import load_prompts, turn_ids
    from runtime.assets import default_pair
    from runtime.decoding import Sampling
    from runtime.loading import load_pair
    from runtime.tokenizer import Tokenizer

    tdir, ddir = default_pair()
    tdir = a.target or str(tdir)
    ar_pair = load_pair(tdir, a.ar_draft or str(ddir), need_draft=True, draft_backend=a.backend)
    ss_pair = load_pair(tdir, a.ss_draft, need_draft=True, draft_backend=a.backend)
    target, drafts = ar_pair.target, {"ar-draft": ar_pair.draft, "ss-draft": ss_pair.draft}
    if not getattr(ss_pair.draft, "ss_streams", 0):
        raise DuetError(f"--ss-draft {a.ss_draft}: not a speculative-streaming draft")
    tok = Tokenizer(tdir)
    runs: dict = {}
    for i, rec in enumerate(load_prompts(None, limit=a.limit)):
        ids = turn_ids(tok, None, rec["turns"], [])
        for t in temps:
            s = Sampling(t)
            ref = one_run("ar", target, None, ids, a.max_tokens, s, a.seed + i)
            runs.setdefault(("ar", "-", t), []).append(ref)
            for m in methods:
                for name, d in drafts.items():
                    r = one_run(m, target, d, ids, a.max_tokens, s, a.seed + i, gamma=a.gamma)
                    r["same"] = r["tokens"] == ref["tokens"]
                    runs.setdefault((m, name, t), []).append(r)
        print(f"prompt {i + 1} done", file=sys.stderr, flush=True)
    rows = summarize(runs)
    report = {"target": tdir, "ar_draft": a.ar_draft or str(ddir), "ss_draft": a.ss_draft,
              "backend": a.backend, "gamma": a.gamma, "prompts": a.limit,
              "max_tokens": a.max_tokens, "rows": rows,
              "note": "machine shared with other jobs: timings are noisy"}  # fmt: skip
    if a.json:
        print(json.dumps(report, indent=2))
        return 0
    print("method  draft     temp  tok/s  speedup  accepted  J     matches_ar")
    for r in rows:
        print(
            f"{r['method']:7s} {r['draft']:9s} {r['temp']:4g} {r['tokens_per_s']:6.2f} "
            f"{r['speedup']:7.3f}  {r['mean_accepted'] or 0:8.3f}  "
            f"{r['draft_passes_per_window'] or 0:4.2f}  {r['matches_ar']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
