"""`python -m apps.bench.studies.enumerative_speed`: ms per row of SQS's integer coding, fast
vs plain path.

    python -m apps.bench.studies.enumerative_speed --vocab 4096,152064 --k 512 --ell 4000 --rows 5

One row is what a K-SQS row costs the coder: rank + unrank of a random K-subset of V (eq. 5)
and of a random lattice point of K counts summing to ell (eq. 2), through kernels/enumerative.py,
once with the fast (GMP) path and once with the plain reference; every round trip is checked.
Reports the median and min over --rows rows of encode + decode ms per row. Wall-clock timings on
whatever else the machine is running: label them so.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from apps.bench.args import parse_numbers
from kernels.enumerative import (
    rank_composition,
    rank_subset,
    unrank_composition,
    unrank_subset,
)
from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


def one_row(rng, v: int, k: int, ell: int, plain: bool) -> dict:
    """ms of rank + unrank for one random subset and one random lattice point."""
    ids = np.sort(rng.choice(v, k, replace=False))
    counts = rng.multinomial(ell - k, np.ones(k) / k) + 1  # Alg. 2's counts are >= 0; any will do
    t0 = time.perf_counter()
    r = rank_subset(ids, v, plain=plain)
    t1 = time.perf_counter()
    back = unrank_subset(r, v, k, plain=plain)
    t2 = time.perf_counter()
    rc = rank_composition(counts, ell, plain=plain)
    t3 = time.perf_counter()
    cb = unrank_composition(rc, ell, k, plain=plain)
    t4 = time.perf_counter()
    if not ((back == ids).all() and (cb == counts).all()):
        raise AssertionError("round trip failed")
    return {
        "subset_ms": 1e3 * (t2 - t0),
        "lattice_ms": 1e3 * (t4 - t2),
        "encode_ms": 1e3 * ((t1 - t0) + (t3 - t2)),
        "decode_ms": 1e3 * ((t2 - t1) + (t4 - t3)),
        "total_ms": 1e3 * (t4 - t0),
    }


def measure(v: int, k: int, ell: int, rows: int, plain: bool, seed: int = 0) -> dict:
    """Median and min per key over `rows` rows."""
    rng = np.random.default_rng(seed)
    recs = [one_row(rng, v, k, ell, plain) for _ in range(rows)]
    out = {"vocab": v, "k": k, "ell": ell, "path": "plain" if plain else "fast", "rows": rows}
    for key in recs[0]:
        vals = [r[key] for r in recs]
        out[key] = float(np.median(vals))
        out[key.replace("_ms", "_min_ms")] = float(min(vals))
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = doc_parser("python -m apps.bench.studies.enumerative_speed", __doc__)
    ap.add_argument(
        "--vocab", default="4096,152064", help="comma-separated V (default 4096,152064)"
    )
    ap.add_argument("--k", type=int, default=512, help="support size K (default 512)")
    ap.add_argument("--ell", type=int, default=4000, help="lattice resolution ell (default 4000)")
    ap.add_argument("--rows", type=int, default=5, help="rows per path and V (default 5)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    vocabs = parse_numbers(a.vocab, "--vocab", int, 1)
    if a.rows < 1 or a.k < 1 or a.ell < a.k or any(v < a.k for v in vocabs):
        raise DuetError("need --rows >= 1, 1 <= --k <= every --vocab, and --ell >= --k")
    res = [measure(v, a.k, a.ell, a.rows, plain) for v in vocabs for plain in (True, False)]
    if a.json:
        print(json.dumps(res))
        return 0
    print(
        f"{'V':>7} {'K':>4} {'ell':>5} {'path':<5} {'subset ms':>9} {'lattice ms':>10} "
        f"{'enc+dec ms':>10} {'(min)':>8}"
    )
    for r in res:
        print(
            f"{r['vocab']:>7} {r['k']:>4} {r['ell']:>5} {r['path']:<5} {r['subset_ms']:>9.2f} "
            f"{r['lattice_ms']:>10.2f} {r['total_ms']:>10.2f} {r['total_min_ms']:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
