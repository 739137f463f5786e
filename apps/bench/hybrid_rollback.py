"""`python -m apps.bench.hybrid_rollback`: what landing a hybrid model's states costs.

On a hybrid (Qwen3.5) checkpoint, for each accepted length A of a γ+1 window it times
  - the verify pass itself (the window through the whole model),
  - rollback by replay (runtime/hybrid_cache.py: only the recurrence, A+1 steps per
    linear layer) as a share of that pass,
  - rollback by redecode (llama.cpp: restore the checkpoint, re-run the A+1 kept tokens
    through the whole model), timed as that re-run.
Median of --reps runs each, PyTorch backend, --threads threads. With --sd it also decodes
--prompts prompts end to end, alternating per prompt (rotated order) `ar`, `sd` with replay
and `sd` with redecode at the same γ, greedy, and reports tokens/s, speedups and whether
every output equals `ar`'s. Prints one JSON object. The default pair is out/hybrid
(apps/bench/hybrid_pair.py: a missing pair is answered with the command that builds it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from runtime.errors import DuetError, cli_main

from .hybrid_pair import hybrid_pair_dirs


def measure(path, *, gamma: int = 4, prompt_len: int = 64, reps: int = 20, threads: int = 1):
    """{verify_ms, replay_ms[A], replay_share[A], redecode_ms[A]} for A in 0..γ: medians, and
    the same from the fastest rep of each (`*_min`: on a shared machine the median carries the
    other jobs' preemptions, which hit a 1 ms replay harder than a 100 ms pass)."""
    from runtime.backends.torch_backend import TorchCausalLM

    model = TorchCausalLM.load(path, threads=threads)
    if not model.config.is_hybrid:
        raise DuetError(f"{path}: not a hybrid (linear-attention) checkpoint")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.config.vocab_size, (1, prompt_len))
    window = rng.integers(0, model.config.vocab_size, (1, gamma + 1))
    prefilled = model.new_cache()
    model.forward(prompt, prefilled)

    def timed(fn) -> tuple[float, float]:
        """(median, min) ms of fn(cache) over fresh copies of the prefilled cache."""
        times = []
        for _ in range(reps):
            cache = prefilled.fork([0])
            times.append(fn(cache) * 1e3)
        return statistics.median(times), min(times)

    def verify(cache):
        t = time.perf_counter()
        model.forward(window, cache)
        return time.perf_counter() - t

    out = {"gamma": gamma, "prompt_len": prompt_len, "threads": threads, "reps": reps}
    out["verify_ms"], out["verify_ms_min"] = timed(verify)
    for k in ("replay_ms", "redecode_ms", "replay_ms_min", "redecode_ms_min"):
        out[k] = {}
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

        out["replay_ms"][a], out["replay_ms_min"][a] = timed(replay_trim)
        out["redecode_ms"][a], out["redecode_ms_min"][a] = timed(redecode)
    out["replay_share"] = {a: ms / out["verify_ms"] for a, ms in out["replay_ms"].items()}
    out["replay_share_min"] = {a: ms / out["verify_ms_min"]
                               for a, ms in out["replay_ms_min"].items()}  # fmt: skip
    return out


def end_to_end(target_dir, draft_dir, *, gamma: int, prompts: int, max_new: int, threads: int):
    """Greedy tokens/s of ar, sd (replay) and sd (redecode), alternated per prompt."""
    from runtime.backends.torch_backend import TorchCausalLM
    from runtime.chat_session import ChatTemplate
    from runtime.decoding import make_steps, run
    from runtime.decoding.events import GREEDY
    from runtime.tokenizer import Tokenizer

    from .prompts import load_prompts, turn_ids

    target = TorchCausalLM.load(target_dir, threads=threads)
    draft = TorchCausalLM.load(draft_dir, threads=threads)
    tok, template = Tokenizer(target_dir), ChatTemplate.load(target_dir)
    runs = {"ar": (None, "replay"), "sd_replay": (draft, "replay"),
            "sd_redecode": (draft, "redecode")}  # fmt: skip
    tot = {k: {"tokens": 0, "wall_s": 0.0, "steps": 0} for k in runs}
    same = {k: 0 for k in runs}
    recs = load_prompts(None, limit=prompts)

    def once(name, ids, n):
        d, mode = runs[name]
        target.hybrid_rollback = draft.hybrid_rollback = mode  # read by new_cache()
        m = "ar" if d is None else "sd"
        kw = {} if d is None else {"gamma": gamma}
        steps = make_steps(m, target, d, ids, max_new=n, sampling=GREEDY, seed=0, **kw)
        return run(steps, max_new=n, eos_ids=target.config.eos_token_ids, prompt_len=len(ids))

    once("sd_replay", turn_ids(tok, template, recs[0]["turns"][:1], []), 4)  # warm-up
    names = list(runs)
    for i, rec in enumerate(recs):
        ids = turn_ids(tok, template, rec["turns"][:1], [])
        out = {}
        for name in names[i % 3 :] + names[: i % 3]:
            g = once(name, ids, max_new)
            out[name] = g.tokens
            tot[name]["tokens"] += len(g.tokens)
            tot[name]["wall_s"] += g.stats.wall_s
            tot[name]["steps"] += len(g.stats.accept_lengths)
        for name in runs:
            same[name] += out[name] == out["ar"]
    res = {"gamma": gamma, "prompts": len(recs), "max_new": max_new, "threads": threads}
    for name, t in tot.items():
        res[name] = {"tokens_per_s": round(t["tokens"] / t["wall_s"], 2), **t,
                     "mean_accepted": round(t["tokens"] / max(t["steps"], 1), 3),
                     "equals_ar": f"{same[name]}/{len(recs)}"}  # fmt: skip
    tps = {k: res[k]["tokens_per_s"] for k in runs}
    res["sd_replay_vs_ar"] = round(tps["sd_replay"] / tps["ar"], 3)
    res["sd_redecode_vs_ar"] = round(tps["sd_redecode"] / tps["ar"], 3)
    res["sd_replay_vs_redecode"] = round(tps["sd_replay"] / tps["sd_redecode"], 3)
    return res


@cli_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m apps.bench.hybrid_rollback", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument(
        "--target",
        default=None,
        help="a hybrid (qwen3_5_text) checkpoint directory (default out/hybrid/target)",
    )
    ap.add_argument("--draft", default=None, help="--sd: the draft (default out/hybrid/draft)")
    ap.add_argument(
        "--sd",
        action="store_true",
        help="also decode prompts end to end: ar, sd replay, sd redecode alternated",
    )
    ap.add_argument("--prompts", type=int, default=8, help="--sd: first N of apps/prompts")
    ap.add_argument("--max-tokens", type=int, default=64, help="--sd: new tokens per prompt")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    if min(a.gamma, a.reps, a.prompt_len, a.threads, a.prompts, a.max_tokens) < 1:
        raise DuetError("--gamma, --reps, --prompt-len, --threads, --prompts and --max-tokens "
                        "must be at least 1")  # fmt: skip
    if a.target is None or (a.sd and a.draft is None):
        t, d = hybrid_pair_dirs()
        a.target, a.draft = a.target or t, a.draft or d
    out = measure(a.target, gamma=a.gamma, prompt_len=a.prompt_len, reps=a.reps,
                  threads=a.threads)  # fmt: skip
    if a.sd:
        out["end_to_end"] = end_to_end(a.target, a.draft, gamma=a.gamma, prompts=a.prompts,
                                       max_new=a.max_tokens, threads=a.threads)  # fmt: skip
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
