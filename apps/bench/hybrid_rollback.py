"""`python -m apps.bench.hybrid_rollback`: what landing a hybrid model's states costs.

On a hybrid (Qwen3.5) checkpoint, for each accepted length A of a γ+1 window it times
  - the verify pass itself (the window through the whole model),
  - rollback by replay (runtime/hybrid_cache.py: only the recurrence, A+1 steps per
    linear layer) as a share of that pass,
  - rollback by redecode (llama.cpp: restore the checkpoint, re-run the A+1 kept tokens
    through the whole model), timed as that re-run.
Median of --reps runs each, on --backend torch (--threads threads) or mlx (mlx-lm's classes,
runtime/backends/mlx_qwen3_5.py; MLX's own CPU threads). Prints one JSON object.
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
    prefilled = model.new_cache()
    model.forward(prompt, prefilled)

    def timed(fn) -> float:
        """Median ms of fn(cache) over fresh copies of the prefilled cache."""
        times = []
        for _ in range(reps):
            cache = prefilled.fork([0])
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

        def redecode(cache, kept=kept):  # the re-run after restoring the checkpoint
            t = time.perf_counter()
            model.forward(window[:, :kept], cache)
            return time.perf_counter() - t

        out["replay_ms"][a] = timed(replay_trim)
        out["redecode_ms"][a] = timed(redecode)
    out["replay_share"] = {a: ms / out["verify_ms"] for a, ms in out["replay_ms"].items()}
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
    a = ap.parse_args(argv)
    if a.gamma < 1 or a.reps < 1 or a.prompt_len < 1 or a.threads < 1:
        raise DuetError("--gamma, --reps, --prompt-len and --threads must be at least 1")
    print(json.dumps(measure(a.target, gamma=a.gamma, prompt_len=a.prompt_len, reps=a.reps,
                             threads=a.threads, backend=a.backend), indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
