"""`python -m apps.bench.studies.edge_keep T1.json T0.json`: how much of the T = 0 speedup
T = 1 keeps.

Issue 10's goal "at T = 1 keep >= 85 % of the T = 0 speedup" compares two runs of
`python -m apps.bench edge ... --out-json F`. Their prompt sets may differ (--limit), and a
prompt's speedup depends on its text far more than on the temperature, so this compares only
the prompts both files hold: per link, speedup = cloud-only ms/token / METHOD's ms/token over
those prompts, share = speedup(T1) / speedup(T0), with a paired percentile bootstrap over the
prompts (a resample draws prompt indices once and uses them in both files). It reads the
files; it runs nothing.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from apps.bench.bootstrap import ci_note, prompt_ci
from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


def _per_prompt(path: str) -> dict:
    """{link: {method: {prompt: (wall_s, tokens)}}} from an apps.bench edge --out-json file."""
    try:
        runs = json.load(open(path))["runs"]
    except (OSError, ValueError, KeyError) as e:
        raise DuetError(f"{path}: not an apps.bench edge --out-json file ({e})") from None
    out: dict = {}
    for r in runs:
        out.setdefault(r["link"], {}).setdefault(r["method"], {})[r["prompt"]] = (
            r["wall_s"], r["tokens"])  # fmt: skip
    return out


def _speedup(runs: dict, method: str, prompts: np.ndarray) -> float:
    def ms(m):
        return sum(runs[m][p][0] for p in prompts) / max(1, sum(runs[m][p][1] for p in prompts))

    return ms("cloud-only") / ms(method)


def keep_shares(
    t1: dict, t0: dict, method: str = "adaptive", resamples: int = 2000, seed: int = 0
) -> list[dict]:
    """Per link both runs hold: the shared prompts, both speedups, the share and its 95 % CI."""
    rng = np.random.default_rng(seed)
    rows = []
    for link in sorted(set(t1) & set(t0)):
        a, b = t1[link], t0[link]
        if not all(m in r for r in (a, b) for m in ("cloud-only", method)):
            continue
        shared = sorted(
            set.intersection(*(set(r[m]) for r in (a, b) for m in ("cloud-only", method)))
        )
        if not shared:
            continue
        ps = np.array(shared)
        s1, s0 = _speedup(a, method, ps), _speedup(b, method, ps)
        row = {"link": link, "method": method, "prompts": len(ps), "speedup_t1": s1,
               "speedup_t0": s0, "share": s1 / s0}  # fmt: skip
        if resamples and len(ps) > 1:

            def share(pick, a=a, b=b, ps=ps):
                return _speedup(a, method, ps[pick]) / _speedup(b, method, ps[pick])

            row["ci95"] = prompt_ci(share, len(ps), resamples, rng)
        rows.append(row)
    return rows


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = doc_parser("python -m apps.bench.studies.edge_keep", __doc__)
    ap.add_argument("t1", help="--out-json of the T = 1 run")
    ap.add_argument("t0", help="--out-json of the T = 0 run")
    ap.add_argument("--method", default="adaptive", help="the row compared (default adaptive)")
    ap.add_argument("--bootstrap", type=int, default=2000, help="resamples (default 2000)")
    a = ap.parse_args(argv)
    rows = keep_shares(_per_prompt(a.t1), _per_prompt(a.t0), a.method, a.bootstrap)
    if not rows:
        raise DuetError(f"the two files share no link with cloud-only and {a.method} runs")
    for r in rows:
        print(
            f"{r['link']:<9} {r['method']}: speedup T=1 {r['speedup_t1']:.2f}x / T=0 "
            f"{r['speedup_t0']:.2f}x = {100 * r['share']:.1f} % kept"
            + ci_note(r.get("ci95"), 100, 1)
            + f" over {r['prompts']} shared prompts"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
