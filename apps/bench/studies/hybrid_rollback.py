"""`python -m apps.bench.studies.hybrid_rollback`: what landing a hybrid model's states costs.

On a hybrid (Qwen3.5) checkpoint, for each accepted length A of a γ+1 window it times
  - the verify pass itself (the window through the whole model),
  - rollback by replay (runtime/caches/hybrid.py: pick the state the verify pass kept, and
    slice the conv state) as a share of that pass, and the same landing with no state kept
    (`replay_log_ms`: only the recurrence replayed, A+1 steps per linear layer, from the base),
  - rollback by redecode (llama.cpp: restore the checkpoint, re-run the A+1 kept tokens
    through the whole model as a pass of their own), timed as the redecode cache's `trim`
    (inside `sd` that re-run is the next window, [last, d1..dA, c], which also yields a token,
    as in llama.cpp's loop: runtime/caches/hybrid.py).
Median of --reps runs each, on --backend torch (--threads threads) or mlx (mlx-lm's classes,
runtime/backends/mlx/qwen3_5.py; MLX's own CPU threads).

With --draft it also runs greedy `sd` end to end (--max-new tokens after the prompt, γ),
replay and redecode alternating --e2e-reps times each, and reports per rollback the target
tokens processed (every forward from layer 0: windows and redecode's re-runs), the tokens
re-run, and tokens/s (median). Prints one JSON object.

With --sd it also decodes --prompts prompts end to end on the pair (torch), alternating per
prompt (rotated order) `ar`, `sd` with replay and `sd` with redecode at the same γ (llama.cpp's
loop, and `sd_redecode_pass`: the re-run as a pass of its own that yields no token), greedy
(or at --temperature, seed 0), and reports tokens/s, speedups and, greedy, whether every
output equals `ar`'s. Without --target the
pair is out/hybrid (apps/bench/hybrid_pair.py: a missing pair is answered with the command
that builds it).
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main

from ..hybrid_pair import hybrid_pair_dirs


def measure(
    path,
    *,
    gamma: int = 4,
    prompt_len: int = 64,
    reps: int = 20,
    threads: int = 1,
    backend: str = "torch",
):
    """{verify_ms, replay_ms[A], replay_share[A], redecode_ms[A], replay_log_ms[A]} for A in
    0..γ."""
    from runtime.backends import load_model

    model = load_model(path, backend, **({"threads": threads} if backend == "torch" else {}))
    if not model.config.is_hybrid:
        raise DuetError(f"{path}: not a hybrid (linear-attention) checkpoint")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.config.vocab_size, (1, prompt_len))
    window = rng.integers(0, model.config.vocab_size, (1, gamma + 1))
    prefilled = {r: cache_with(model, r) for r in ("replay", "redecode")}
    prefilled["replay_log"] = cache_with(model, "replay")
    if backend == "torch":
        prefilled["replay_log"].keep = prefilled["replay_log"].stride = 0  # no kept states
    for cache in prefilled.values():
        model.forward(prompt, cache)
        model.forward(window[:, :1], cache)  # and land back: the log starts at the prompt's
        cache.trim(1)  # end, as it does after each verify in sd (not inside a long prefill)

    def timed(fn, rollback: str = "replay") -> tuple[float, float]:
        """(median, min) ms of fn(cache) over fresh copies of the prefilled cache (on a shared
        machine the median carries other jobs' preemptions, which hit a 1 ms replay harder
        than a 100 ms pass; the fastest rep does not)."""
        times = []
        for _ in range(reps):
            cache = prefilled[rollback].fork([0])
            times.append(fn(cache) * 1e3)
        return statistics.median(times), min(times)

    def verify(cache):
        t = time.perf_counter()
        model.forward(window, cache)
        return time.perf_counter() - t

    out = {"backend": backend, "gamma": gamma, "prompt_len": prompt_len, "threads": threads,
           "reps": reps}  # fmt: skip
    out["verify_ms"], out["verify_ms_min"] = timed(verify)
    for k in (
        "replay_ms",
        "redecode_ms",
        "replay_log_ms",
        "replay_ms_min",
        "redecode_ms_min",
        "replay_log_ms_min",
    ):
        out[k] = {}
    for a in range(gamma + 1):
        kept = a + 1  # accepted drafts + the last committed token

        def replay_trim(cache, kept=kept):
            model.forward(window, cache)
            t = time.perf_counter()
            cache.trim(gamma + 1 - kept)
            return time.perf_counter() - t

        out["replay_ms"][a], out["replay_ms_min"][a] = timed(replay_trim)
        # restore + re-run the kept tokens
        out["redecode_ms"][a], out["redecode_ms_min"][a] = timed(replay_trim, "redecode")
        out["replay_log_ms"][a], out["replay_log_ms_min"][a] = timed(replay_trim, "replay_log")
    out["replay_share"] = {a: ms / out["verify_ms"] for a, ms in out["replay_ms"].items()}
    out["replay_share_min"] = {
        a: ms / out["verify_ms_min"] for a, ms in out["replay_ms_min"].items()
    }
    return out


def cache_with(model, rollback: str):
    """A new cache of `model` that rolls back by `rollback`."""
    was, model.hybrid_rollback = model.hybrid_rollback, rollback
    try:
        return model.new_cache()
    finally:
        model.hybrid_rollback = was


def counted_sd(
    path,
    draft_path,
    *,
    gamma: int = 4,
    prompt_len: int = 16,
    max_new: int = 64,
    reps: int = 3,
    threads: int = 1,
    backend: str = "torch",
):
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
            steps = make_steps(
                "sd",
                target,
                draft,
                prompt,
                max_new=max_new,
                sampling=GREEDY,
                seed=0,
                gamma=gamma,
                target_cache=tc,
            )
            res = run(steps, max_new=max_new)
            row["tok_s"].append(len(res.tokens) / (time.perf_counter() - t))
            tokens.setdefault(r, res.tokens)
            row.update(
                processed=counted[0],
                redecoded=getattr(tc, "redecoded", 0),
                generated=len(res.tokens),
                steps=len(res.stats.accepted),
                accepted=sum(res.stats.accepted),
                draft_s=res.stats.draft_s,
                verify_s=res.stats.verify_s,
            )
    for row in out.values():
        row["tok_s"] = statistics.median(row["tok_s"])
    out["same_tokens"] = tokens["replay"] == tokens["redecode"]
    out["replay_over_redecode"] = out["replay"]["tok_s"] / out["redecode"]["tok_s"]
    return out


def end_to_end(
    target_dir,
    draft_dir,
    *,
    gamma: int,
    prompts: int,
    max_new: int,
    threads: int,
    temperature: float = 0.0,
    draft_backend: str = "onnx",
):
    """Tokens/s of ar, sd (replay) and sd (redecode), alternated per prompt. The draft runs on
    `draft_backend`: onnx (what `runtime.generate` loads for a hybrid draft, its rollback picking
    the states kept per position) or torch (its rollback then follows the target's mode)."""
    from runtime.backends.torch.causal_lm import TorchCausalLM
    from runtime.chat_session import ChatTemplate
    from runtime.decoding import make_steps, run
    from runtime.decoding.events import Sampling
    from runtime.tokenizer import Tokenizer

    from ..prompt_set import load_prompts, turn_ids

    target = TorchCausalLM.load(target_dir, threads=threads)
    if draft_backend == "onnx":  # as runtime.loading.load_pair loads a draft directory
        from runtime.backends import load_model

        draft = load_model(draft_dir, "onnx", intra_threads=threads, provider="cpu")
    else:
        draft = TorchCausalLM.load(draft_dir, threads=threads)
    tok, template = Tokenizer(target_dir), ChatTemplate.load(target_dir)
    runs = {"ar": (None, "replay"), "sd_replay": (draft, "replay"),
            "sd_redecode": (draft, "redecode"),
            "sd_redecode_pass": (draft, "redecode")}  # fmt: skip
    tot = {k: {"tokens": 0, "wall_s": 0.0, "steps": 0} for k in runs}
    same = {k: 0 for k in runs}
    recs = load_prompts(None, limit=prompts)
    sampling = Sampling(temperature)

    def once(name, ids, n):
        d, mode = runs[name]
        target.hybrid_rollback = mode  # read by new_cache()
        if draft_backend == "torch":
            draft.hybrid_rollback = mode
        m = "ar" if d is None else "sd"
        kw = {} if d is None else {"gamma": gamma}
        if name == "sd_redecode_pass":  # the re-run as a pass of its own, yielding no token
            kw["target_cache"] = target.new_cache()
            kw["target_cache"].reverify = False
        steps = make_steps(m, target, d, ids, max_new=n, sampling=sampling, seed=0, **kw)
        return run(steps, max_new=n, eos_ids=target.config.eos_token_ids, prompt_len=len(ids))

    once("sd_replay", turn_ids(tok, template, recs[0]["turns"][:1], []), 4)  # warm-up
    names = list(runs)
    for i, rec in enumerate(recs):
        ids = turn_ids(tok, template, rec["turns"][:1], [])
        out = {}
        for name in names[i % len(names) :] + names[: i % len(names)]:
            g = once(name, ids, max_new)
            out[name] = g.tokens
            tot[name]["tokens"] += len(g.tokens)
            tot[name]["wall_s"] += g.stats.wall_s
            tot[name]["steps"] += len(g.stats.accept_lengths)
        for name in runs:
            same[name] += out[name] == out["ar"]
    res = {"gamma": gamma, "prompts": len(recs), "max_new": max_new, "threads": threads,
           "temperature": temperature, "draft_backend": draft_backend}  # fmt: skip
    for name, t in tot.items():
        res[name] = {"tokens_per_s": round(t["tokens"] / t["wall_s"], 2), **t,
                     "tokens_per_step": round(t["tokens"] / max(t["steps"], 1), 3)}  # fmt: skip
        if sampling.greedy:
            res[name]["equals_ar"] = f"{same[name]}/{len(recs)}"
    tps = {k: res[k]["tokens_per_s"] for k in runs}
    res["sd_replay_vs_ar"] = round(tps["sd_replay"] / tps["ar"], 3)
    res["sd_redecode_vs_ar"] = round(tps["sd_redecode"] / tps["ar"], 3)
    res["sd_replay_vs_redecode"] = round(tps["sd_replay"] / tps["sd_redecode"], 3)
    res["sd_replay_vs_redecode_pass"] = round(tps["sd_replay"] / tps["sd_redecode_pass"], 3)
    return res


def build_parser():
    ap = doc_parser("python -m apps.bench.studies.hybrid_rollback", __doc__)
    ap.add_argument(
        "--target",
        default=None,
        help="a hybrid (qwen3_5_text) checkpoint directory (default out/hybrid/target)",
    )
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", choices=("torch", "mlx"), default="torch")
    ap.add_argument(
        "--draft",
        help="a draft checkpoint: also run sd on a random prompt both "
        "ways, counting the tokens processed and re-run (with --sd: the pair's "
        "draft, default out/hybrid/draft)",
    )
    ap.add_argument(
        "--sd",
        action="store_true",
        help="also decode prompts end to end: ar, sd replay, sd redecode alternated",
    )
    ap.add_argument("--prompts", type=int, default=8, help="--sd: first N of apps/prompts")
    ap.add_argument("--max-tokens", type=int, default=64, help="--sd: new tokens per prompt")
    ap.add_argument("--temperature", type=float, default=0.0, help="--sd: 0 is greedy")
    ap.add_argument(
        "--draft-backend",
        choices=("onnx", "torch"),
        default="onnx",
        help="--sd: the draft's backend (default onnx, what runtime.generate loads "
        "for a hybrid draft; torch: its rollback follows the target's mode)",
    )
    ap.add_argument("--max-new", type=int, default=64, help="end-to-end tokens per run")
    ap.add_argument("--e2e-reps", type=int, default=3)
    return ap


@cli_main
def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if (
        min(
            a.gamma, a.reps, a.prompt_len, a.threads, a.max_new, a.e2e_reps, a.prompts, a.max_tokens
        )
        < 1
    ):
        raise DuetError(
            "--gamma, --reps, --prompt-len, --threads, --max-new, --e2e-reps, "
            "--prompts and --max-tokens must be at least 1"
        )
    if not a.temperature >= 0:
        raise DuetError(f"--temperature must be at least 0 (got {a.temperature})")
    counted = a.draft is not None and not a.sd
    if a.target is None or (a.sd and a.draft is None):
        t, d = hybrid_pair_dirs()
        a.target, a.draft = a.target or t, a.draft or d
    shared = {"gamma": a.gamma, "threads": a.threads}  # every part's window and threads
    timed = {**shared, "prompt_len": a.prompt_len, "backend": a.backend}  # the random-prompt parts
    res = measure(a.target, reps=a.reps, **timed)
    if counted:
        res["sd"] = counted_sd(a.target, a.draft, max_new=a.max_new, reps=a.e2e_reps, **timed)
    if a.sd:
        res["end_to_end"] = end_to_end(
            a.target,
            a.draft,
            prompts=a.prompts,
            max_new=a.max_tokens,
            temperature=a.temperature,
            draft_backend=a.draft_backend,
            **shared,
        )
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
