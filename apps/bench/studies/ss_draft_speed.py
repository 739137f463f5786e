"""`python -m apps.bench.studies.ss_draft_speed`: draft-only speedup of a speculative-streaming
draft (Mirror-SD App. D.2, Fig. 6b shape): time and internal passes J to draft a γ-token window.

    nice -n 10 python -m apps.bench.studies.ss_draft_speed --draft runs/ss-draft --gammas 2,4,6,8 \\
        --limit 5

Contexts are real: each prompt of the benchmark set (apps/prompts/) followed by the
target's own greedy continuation; windows are drafted from `--windows` positions along it.
At each position and γ the same draft drafts the window twice, alternating: as an
autoregressive draft (its main stream, one pass per token) and with its lookahead streams
(runtime/decoding/ss_draft.py, J passes). The two windows are the same tokens (checked);
only J and the time differ. `--ar-draft DIR` adds a separate ordinary draft (e.g. the
embedded draft the SS one was distilled from) on the same backend (`--backend`, default
onnx: on ONNX Runtime "autoregressive" is the SS graph with no streams). Timings exclude the
prefill of the context (a cache fork per window). It does not run the target's verification.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from apps.bench.args import parse_numbers
from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


class MainStreamOnly:
    """An SS draft seen as an ordinary draft: its main stream, one pass per token."""

    def __init__(self, ss):
        self.inner, self.config = ss, ss.config

    def forward(self, tokens, cache, **kw):
        return self.inner.forward(tokens, cache, **kw)

    def new_cache(self, batch: int = 1):
        return self.inner.new_cache(batch)


def contexts(target, tok, limit: int, cont: int, prompts=None) -> list[list[int]]:
    """Each prompt's ids followed by `cont` greedy target tokens."""
    from apps.bench.prompt_set import load_prompts, turn_ids
    from runtime.decoding import Sampling, make_steps, run

    out = []
    for rec in load_prompts(prompts, limit=limit):
        ids = turn_ids(tok, None, rec["turns"], [])
        steps = make_steps("ar", target, None, ids, max_new=cont, sampling=Sampling(), seed=0)
        out.append(ids + run(steps, max_new=cont).tokens)
    return out


def _time_window(draft, base_cache, ctx, gamma) -> tuple[list[int], float, int]:
    from runtime.decoding import Sampling
    from runtime.decoding.sd import draft_window

    cache = base_cache.fork([0])
    info: dict = {}
    t0 = time.perf_counter()
    toks, _ = draft_window(draft, cache, ctx, gamma, Sampling(), None, info=info)
    return toks, time.perf_counter() - t0, info["passes"]


def measure(ss, ar_extra, ctxs, gammas: list[int], windows: int) -> dict:
    """{γ: {"J_ss", "eta", "ss_ms", "ar_ms", "speedup", ...}} over every context position."""
    rows = {g: {"J": [], "ss": [], "ar": [], "extra": []} for g in gammas}
    main = MainStreamOnly(ss)
    for ctx in ctxs:
        lo = max(1, len(ctx) // 3)
        for p in np.linspace(lo, len(ctx) - 1, windows).astype(int):
            prefix = ctx[:p]
            base = ss.new_cache()
            ss.forward(np.array([prefix[:-1]]), base)  # the context's prefill, not timed
            extra_base = None
            if ar_extra is not None:
                extra_base = ar_extra.new_cache()
                ar_extra.forward(np.array([prefix[:-1]]), extra_base)
            for g in gammas:
                a, t_ar, _ = _time_window(main, base, prefix, g)
                b, t_ss, j = _time_window(ss, base, prefix, g)
                if a != b:
                    raise AssertionError(f"SS window {b} differs from the AR window {a}")
                rows[g]["J"].append(j)
                rows[g]["ss"].append(t_ss)
                rows[g]["ar"].append(t_ar)
                if extra_base is not None:
                    rows[g]["extra"].append(_time_window(ar_extra, extra_base, prefix, g)[1])
    out = {}
    for g, r in rows.items():
        J = float(np.mean(r["J"]))
        ss_ms, ar_ms = 1e3 * float(np.mean(r["ss"])), 1e3 * float(np.mean(r["ar"]))
        out[g] = {"windows": len(r["J"]), "J_ar": g, "J_ss": round(J, 3),
                  "eta_bar": round(g / J, 3), "ar_ms": round(ar_ms, 3), "ss_ms": round(ss_ms, 3),
                  "speedup": round(ar_ms / ss_ms, 3)}  # fmt: skip
        if r["extra"]:
            out[g]["ar_draft_ms"] = round(1e3 * float(np.mean(r["extra"])), 3)
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = doc_parser("python -m apps.bench.studies.ss_draft_speed", __doc__)
    ap.add_argument("--draft", required=True, help="SS draft checkpoint (apps.train ss-draft)")
    ap.add_argument("--target", default=None, help="target (default: the embedded one)")
    ap.add_argument("--ar-draft", default=None, help="an ordinary draft to time beside it")
    ap.add_argument("--gammas", default="2,4,6,8", help="window lengths (default 2,4,6,8)")
    ap.add_argument("--limit", type=int, default=5, help="prompts (default 5)")
    ap.add_argument("--prompts", default=None, help="prompt set (default apps/prompts/)")
    ap.add_argument("--continuation", type=int, default=48, help="target tokens after a prompt")
    ap.add_argument("--windows", type=int, default=8, help="positions per context (default 8)")
    ap.add_argument(
        "--backend",
        choices=["onnx", "torch"],
        default="onnx",
        help="runs both drafts (default onnx, the draft's home)",
    )
    ap.add_argument("--threads", type=int, default=1, help="draft / torch threads (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    gammas = parse_numbers(a.gammas, "--gammas", int, 1)
    if a.limit < 1 or a.windows < 1 or a.continuation < 1:
        raise DuetError("--limit, --windows and --continuation must be >= 1")
    import torch

    from runtime.assets import default_pair
    from runtime.backends import load_model
    from runtime.decoding.ss_draft import is_ss_draft
    from runtime.tokenizer import Tokenizer

    torch.set_num_threads(a.threads)
    tdir = a.target or str(default_pair()[0])
    kw = {"intra_threads": a.threads} if a.backend == "onnx" else {}
    ss = load_model(a.draft, a.backend, **kw)
    if not is_ss_draft(ss):
        raise DuetError(f"--draft {a.draft}: not a speculative-streaming draft")
    target = load_model(tdir, "torch", threads=a.threads)
    extra = load_model(a.ar_draft, a.backend, **kw) if a.ar_draft else None
    ctxs = contexts(target, Tokenizer(tdir), a.limit, a.continuation, a.prompts)
    res = measure(ss, extra, ctxs, gammas, a.windows)
    report = {"draft": a.draft, "streams": ss.ss_streams, "backend": a.backend,
              "threads": a.threads, "contexts": len(ctxs), "greedy": True, "per_gamma": res,
              "note": "machine shared with other jobs: timings are noisy"}  # fmt: skip
    if a.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"SS draft {a.draft} ({ss.ss_streams} streams), {a.backend}, {a.threads} thread(s), "
        f"{len(ctxs)} contexts x {a.windows} positions, greedy",
        file=sys.stderr,
    )
    cols = "gamma  J_ar  J_ss  eta_bar  ar_ms  ss_ms  speedup" + ("  ar_draft_ms" if extra else "")
    print(cols)
    for g, r in res.items():
        line = (
            f"{g:5d} {g:5d} {r['J_ss']:5.2f} {r['eta_bar']:7.2f} {r['ar_ms']:6.2f} "
            f"{r['ss_ms']:6.2f} {r['speedup']:7.2f}"
        )
        print(line + (f" {r['ar_draft_ms']:11.2f}" if extra else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
