"""Verifier throughput under concurrent sessions, and memory per session.

    python -m apps.cloud.load [--sessions 1,8,64] [--max-tokens 32] [--k 4]

Starts a local verifier subprocess (embedded target unless --target), then for each count N
runs N client threads at once, each a flexspec generation with the embedded draft on its own
prompt (no link emulation). Reports committed tokens per second summed over the sessions, and
the server's resident memory with the N sessions open minus idle, per session (Linux /proc).
The clients draft in this process, so on a small machine they compete with the server for
cores: the figure is end-to-end, not the verifier alone.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from runtime.cli_parser import doc_parser
from runtime.errors import cli_main


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (Linux)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_n(n, host, port, token, draft, prompts, max_tokens, k, pid) -> dict:
    from types import SimpleNamespace

    from runtime.edge.client import Connection
    from runtime.session import GenerationSession

    conns = [Connection(host, port, token) for _ in range(n)]
    for c, p in zip(conns, prompts, strict=False):
        c.open(p, 0, 1, 0, 0)  # open all N first: memory with N sessions held
    peak = rss_bytes(pid)
    for c in conns:
        c.close_session()
    counts = [0] * n
    barrier = threading.Barrier(n)

    # the draft stands in for the target (the verifier holds it), as the companion client runs
    pair = SimpleNamespace(target=draft, draft=draft, tokenizer=None)

    def client(i):
        options = {"conn": conns[i], "k": k}
        # eos=(): every session runs its max_tokens (no EOS cut)
        s = GenerationSession(pair, method="flexspec", options=options, eos=(), summarize=False)
        barrier.wait()
        for r in s.stream(prompts[i], max_tokens, seed=i):
            counts[i] += len(r.tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    return {
        "sessions": n,
        "tokens": sum(counts),
        "wall_s": wall,
        "tokens_per_s": sum(counts) / wall,
        "rss_with_sessions": peak,
    }


@cli_main
def main(argv=None) -> int:
    ap = doc_parser("python -m apps.cloud.load", __doc__)
    ap.add_argument("--sessions", default="1,8,64")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args(argv)
    from runtime.edge.local import LocalVerifier
    from runtime.loading import load_pair

    pair = load_pair(None, None, need_draft=True)
    text = ["def fib(n):", "The capital of France", "import numpy as np", "Once upon a time"]
    counts = [int(x) for x in a.sessions.split(",")]
    prompts = [pair.tokenizer.encode(text[i % 4] + " " * (i // 4)) for i in range(max(counts))]
    with LocalVerifier(pair.target_dir, extra_args=("--max-sessions", str(max(counts)))) as lv:
        time.sleep(0.5)
        idle = rss_bytes(lv.proc.pid)
        rows = []
        for n in counts:
            r = run_n(
                n, lv.host, lv.port, lv.token, pair.draft, prompts, a.max_tokens, a.k, lv.proc.pid
            )
            r["rss_idle"] = idle
            r["bytes_per_session"] = (r["rss_with_sessions"] - idle) / n
            rows.append(r)
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
