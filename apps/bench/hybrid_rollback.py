"""`python -m apps.bench.hybrid_rollback`: what landing a hybrid model's states costs.

On a hybrid (Qwen3.5) checkpoint, for each accepted length A of a γ+1 window it times
  - the verify pass itself (the window through the whole model),
  - rollback by replay (runtime/hybrid_cache.py: only the recurrence, A+1 steps per
    linear layer) as a share of that pass,
  - rollback by redecode (llama.cpp: restore the checkpoint, re-run the A+1 kept tokens
    through the whole model as a pass of their own), timed as the redecode cache's `trim`.
Median of --reps runs each, on --backend torch (--threads threads) or mlx (mlx-lm's classes,
runtime/backends/mlx_qwen3_5.py; MLX's own CPU threads).

With --draft it also runs greedy `sd` end to end (--max-new tokens after the prompt, γ),
replay and redecode alternating --e2e-reps times each, and reports per rollback the target
tokens processed (every forward from layer 0: windows and redecode's re-runs), the tokens
re-run, and tokens/s (median). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from runtime.errors import DuetError, cli_main


def measure(path, *, gamma: int = 4, prompt_len: int = 64, reps: int = 20, threads: int = 1,
            backend: str = "torch"):  # fmt: skip
    """{verify_ms, replay_ms[A], replay_share[A], redecode_ms[A]} for A in 0..γ."""
    from runtime.backends import load_model

    model = load_model(path, backend, **({"threads": threads} if backend == "torch" else {}))
    if not model.config.is_hybrid:
        raise DuetError(f"{path}: not a hybrid (linear-attention) checkpoint")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.config.vocab_size, (1, prompt_len))
    window = rng.integers(0, model.config.vocab_size, (1, gamma + 1))
    prefilled = {r: cache_with(model, r) for r in ("replay", "redecode")}
    for cache in prefilled.values():
        model.forward(prompt, cache)

    def timed(fn, rollback: str = "replay") -> float:
        """Median ms of fn(cache) over fresh copies of the prefilled cache."""
        times = []
        for _ in range(reps):
            cache = prefilled[rollback].fork([0])
            times.append(fn(cache) * 1e3)
        return statistics.median(times)

    def verify(cache):
        t = time.perf_counter()
        model.forward(window, cache)
        return time.perf_counter() - t

    out = {"backend": backend, "gamma": gamma, "prompt_len": prompt_len, "threads": threads,
           "verify_ms": timed(verify), "replay_ms": {}, "redecode_ms": {}}  # fmt: skip
    for a in range(gamma + 1):
        kept = a + 1  # accepted drafts + the last committed token

        def replay_trim(cache, kept=kept):
            model.forward(window, cache)
            t = time.perf_counter()
            cache.trim(gamma + 1 - kept)
            return time.perf_counter() - t

        out["replay_ms"][a] = timed(replay_trim)
        out["redecode_ms"][a] = timed(replay_trim, "redecode")  # restore + re-run kept tokens
    out["replay_share"] = {a: ms / out["verify_ms"] for a, ms in out["replay_ms"].items()}
    return out


def cache_with(model, rollback: str):
    """A new cache of `model` that rolls back by `rollback`."""
    was, model.hybrid_rollback = model.hybrid_rollback, rollback
    try:
        return model.new_cache()
    finally:
        model.hybrid_rollback = was


def end_to_end(path, draft_path, *, gamma: int = 4, prompt_len: int = 16, max_new: int = 64,
               reps: int = 3, threads: int = 1, backend: str = "torch"):  # fmt: skip
    """Greedy sd, replay and redecode alternating: {rollback: {processed, redecoded,
    generated, steps, accepted, draft_s, verify_s, tok_s}} (tok_s the median, the seconds
    the last run's; the counts are the same every run). Rollback time is in neither draft_s
    nor verify_s, only in tok_s."""
    from runtime.backends import load_model
    from runtime.decoding import make_steps, run
    from runtime.decoding.events import GREEDY

    kw = {"threads": threads} if backend == "torch" else {}
    target, draft = load_model(path, backend, **kw), load_model(draft_path, backend, **kw)
    prompt = np.random.default_rng(1).integers(0, target.config.vocab_size, prompt_len).tolist()
    counted, inner = [0], target.forward_layers

    def forward_layers(x, cache, start, stop, **k):
        if start == 0:
            counted[0] += np.asarray(x).shape[1]
        return inner(x, cache, start, stop, **k)

    target.forward_layers = forward_layers
    out = {r: {"tok_s": []} for r in ("replay", "redecode")}
    tokens = {}
    for _ in range(reps):
        for r, row in out.items():
            tc = cache_with(target, r)
            counted[0] = 0
            t = time.perf_counter()
            steps = make_steps("sd", target, draft, prompt, max_new=max_new, sampling=GREEDY,
                               seed=0, gamma=gamma, target_cache=tc)  # fmt: skip
            res = run(steps, max_new=max_new)
            row["tok_s"].append(len(res.tokens) / (time.perf_counter() - t))
            tokens.setdefault(r, res.tokens)
            row.update(processed=counted[0], redecoded=getattr(tc, "redecoded", 0),
                       generated=len(res.tokens), steps=len(res.stats.accepted),
                       accepted=sum(res.stats.accepted), draft_s=res.stats.draft_s,
                       verify_s=res.stats.verify_s)  # fmt: skip
    for row in out.values():
        row["tok_s"] = statistics.median(row["tok_s"])
    out["same_tokens"] = tokens["replay"] == tokens["redecode"]
    out["replay_over_redecode"] = out["replay"]["tok_s"] / out["redecode"]["tok_s"]
    return out


@cli_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m apps.bench.hybrid_rollback", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--target", required=True, help="a hybrid (qwen3_5_text) checkpoint directory")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", choices=("torch", "mlx"), default="torch")
    ap.add_argument("--draft", help="a draft checkpoint: also run sd end to end both ways")
    ap.add_argument("--max-new", type=int, default=64, help="end-to-end tokens per run")
    ap.add_argument("--e2e-reps", type=int, default=3)
    a = ap.parse_args(argv)
    if min(a.gamma, a.reps, a.prompt_len, a.threads, a.max_new, a.e2e_reps) < 1:
        raise DuetError("--gamma, --reps, --prompt-len, --threads, --max-new and --e2e-reps "
                        "must be at least 1")  # fmt: skip
    res = measure(a.target, gamma=a.gamma, prompt_len=a.prompt_len, reps=a.reps,
                  threads=a.threads, backend=a.backend)  # fmt: skip
    if a.draft:
        res["sd"] = end_to_end(a.target, a.draft, gamma=a.gamma, prompt_len=a.prompt_len,
                               max_new=a.max_new, reps=a.e2e_reps, threads=a.threads,
                               backend=a.backend)  # fmt: skip
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
