"""Shared pieces of the edge-cloud tests: an in-process verifier, ar references and the edge
bench's record."""

import json

from runtime.decoding import make_steps, run
from runtime.decoding.events import GREEDY


def ar_tokens(target, prompt, n):
    steps = make_steps("ar", target, None, prompt, max_new=n, sampling=GREEDY, seed=0)
    return run(steps, max_new=n, eos_ids=target.config.eos_token_ids).tokens


def flexspec(conn, draft, prompt, n, *, sampling=GREEDY, seed=0, **opts):
    steps = make_steps(
        "flexspec", None, draft, prompt, max_new=n, sampling=sampling, seed=seed, conn=conn, **opts
    )
    return run(steps, max_new=n, eos_ids=draft.config.eos_token_ids)


def edge_bench_json(main, path, *args: str) -> dict:
    """`main(ARGS ...)`, an `apps.bench` edge command, on one prompt at T = 1 over no link: it
    exits 0, and what it wrote to `path` (--out-json)."""
    argv = [*args, "--links", "none", "--limit", "1", "--temps", "1", "--out-json", str(path)]
    assert main(argv) == 0
    return json.loads(path.read_text())
