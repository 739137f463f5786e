"""`python -m apps.bench.studies.contention`: do this machine's cores compute in parallel?

Mirror-SD runs the draft and the target at once; it can only gain where the two
really run side by side. This measures, in separate processes (so Python's GIL
plays no part):
  - a single-thread matmul loop alone, then two such loops at once;
  - the target's (γ+1)-token pass alone, then while the draft loops in another
    process (the embedded pair unless --target/--draft are given; --no-pair skips it).
`matmul_slowdown` near 1: the cores compute independently (near 2: they share one
core's arithmetic). `target_slowdown` well above `matmul_slowdown`: the target's pass
is limited by what the two share (memory bandwidth, last-level cache), and drafting
at the same time costs it that much.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


def _matmul_ms(iters: int, out=None, barrier=None) -> float:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    for _ in range(20):
        a @ b
    if barrier is not None:  # both loops start together, after their imports
        barrier.wait(300)
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    ms = (time.perf_counter() - t) / iters * 1e3
    if out is not None:
        out.put(ms)
    return ms


def _draft_loop(target, draft, ready, stop) -> None:
    import numpy as np

    from runtime.loading import load_pair

    d = load_pair(target, draft, need_draft=True, target_backend="torch").draft
    cache = d.new_cache()
    d.forward(np.array([list(range(5, 105))]), cache)
    rows = cache.fork([0] * 8)
    ready.set()
    while not stop.is_set():
        d.forward(np.array([[7]] * 8), rows)
        rows.trim(1)


def _target_ms(target, draft, gamma: int, iters: int, with_draft: bool) -> float:
    import numpy as np

    from runtime.loading import load_pair

    t = load_pair(target, draft, need_draft=False, target_backend="torch").target
    seq = list(range(5, 105))
    cache = t.new_cache()
    t.forward(np.array([seq]), cache)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = None
    if with_draft:
        proc = ctx.Process(target=_draft_loop, args=(target, draft, ready, stop), daemon=True)
        proc.start()
        if not ready.wait(120):
            raise DuetError("the draft process did not start")
    try:
        window = np.array([seq[: gamma + 1]])
        t.forward(window, cache)
        cache.trim(gamma + 1)
        t0 = time.perf_counter()
        for _ in range(iters):
            t.forward(window, cache)
            cache.trim(gamma + 1)
        return (time.perf_counter() - t0) / iters * 1e3
    finally:
        if proc is not None:
            stop.set()
            proc.join(5)


def measure(iters: int, pair_iters: int, target, draft, gamma: int, pair: bool) -> dict:
    ctx = mp.get_context("spawn")
    alone = _matmul_ms(iters)
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_matmul_ms, args=(iters, q, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    together = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    out = {
        "matmul_ms_alone": round(alone, 4),
        "matmul_ms_two_at_once": [round(x, 4) for x in together],
        "matmul_slowdown": round(sum(together) / len(together) / alone, 3),
    }
    if pair:
        a = _target_ms(target, draft, gamma, pair_iters, with_draft=False)
        b = _target_ms(target, draft, gamma, pair_iters, with_draft=True)
        out |= {
            "target_window_ms_alone": round(a, 3),
            "target_window_ms_with_draft_process": round(b, 3),
            "target_slowdown": round(b / a, 3),
            "window_tokens": gamma + 1,
        }
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = doc_parser("python -m apps.bench.studies.contention", __doc__)
    ap.add_argument("--target", default=None, help="target (default: embedded pair)")
    ap.add_argument("--draft", default=None, help="draft (default: embedded pair)")
    ap.add_argument("--gamma", type=int, default=4, help="window is γ+1 tokens (default 4)")
    ap.add_argument("--iters", type=int, default=2000, help="matmuls per loop (default 2000)")
    ap.add_argument("--pair-iters", type=int, default=40, help="target passes (default 40)")
    ap.add_argument("--no-pair", action="store_true", help="matmul check only")
    a = ap.parse_args(argv)
    if a.iters < 1 or a.pair_iters < 1 or a.gamma < 0:
        raise DuetError("--iters and --pair-iters must be >= 1, --gamma >= 0")
    print(json.dumps(measure(a.iters, a.pair_iters, a.target, a.draft, a.gamma, not a.no_pair)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
