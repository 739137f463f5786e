"""How closely a draft follows its target, measured offline on held-out text.

Two sets of positions, both held out from training:

- corpus windows (the held-out files of the pair's split): KL(p ‖ q), TV(p, q) and top-1
  agreement at T = 1, with teacher forcing on the real text;
- sampled contexts: the target continues each held-out prompt (apps/prompts/, first turn,
  the way apps.bench builds it) for `n_tokens` tokens with `ar` at T = 1 and top-p, seed i
  for prompt i, so the contexts are the ones sampling speculative decoding actually sees.
  On them: the per-token acceptance of rejection sampling at that setting, Σ min(p, q) over
  the top-p laws of both (Leviathan et al. 2023, §3.2: β = Σ min(p, q)), greedy top-1
  agreement on the same positions, TV and KL at T = 1 without top-p. Greedy agreement is
  also measured on the target's greedy continuations of the same prompts: that is the
  per-token acceptance greedy speculative decoding sees.

Both models run on Duet's own PyTorch backend, as saved (bf16 weights, float32 maths). The
contexts depend only on the target and the seeds, so two calls on the same target see the
same positions; `contexts_sha` records which. This module measures; it trains nothing.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from kernels.sampling import probs_from_logits

from .corpus import eval_windows


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def law_metrics(t_logits: np.ndarray, d_logits: np.ndarray, top_p: float) -> dict:
    """Per-position (N,) arrays for target/draft logits (N, V): `accept` (Σ min(p, q) at T = 1,
    top-p), `greedy` (argmax agreement), `tv` and `kl` at T = 1 without top-p."""
    lp, lq = _log_softmax(t_logits.astype(np.float64)), _log_softmax(d_logits.astype(np.float64))
    p, q = np.exp(lp), np.exp(lq)
    pn, qn = probs_from_logits(t_logits, 1.0, top_p), probs_from_logits(d_logits, 1.0, top_p)
    return {
        "accept": np.minimum(pn, qn).sum(-1),  # β of Leviathan et al. §3.2 at this setting
        "greedy": (t_logits.argmax(-1) == d_logits.argmax(-1)).astype(np.float64),
        "tv": 0.5 * np.abs(p - q).sum(-1),
        "kl": (p * (lp - lq)).sum(-1),
    }


def sampled_contexts(
    target, prompt_ids: list[list[int]], n_tokens: int, top_p: float, temp: float = 1.0
):
    """[(prompt ids, prompt + continuation)] with the continuation drawn by `ar` from `target`
    (a runtime CausalLM) at `temp` (0: greedy), `top_p`, seed i for prompt i."""
    from types import SimpleNamespace

    from runtime.decoding.events import Sampling
    from runtime.session import GenerationSession

    # the target alone as a pair; the session's EOS: the target's config.json's
    pair = SimpleNamespace(target=target, draft=None, tokenizer=None)
    session = GenerationSession(pair, method="ar", summarize=False)
    out = []
    for i, ids in enumerate(prompt_ids):
        turn = session.stream(ids, n_tokens, sampling=Sampling(temp, top_p), seed=i)
        out.append((ids, ids + [t for r in turn for t in r.tokens]))
    return out


def contexts_sha(contexts) -> str:
    """A short digest of the contexts, to show two evaluations saw the same positions."""
    h = hashlib.sha256()
    for _, seq in contexts:
        h.update(np.asarray(seq, np.int64).tobytes() + b"|")
    return h.hexdigest()[:16]


def _logits(model, seq: list[int]) -> np.ndarray:
    return np.asarray(model.forward(np.array([seq]), model.new_cache())[0], np.float32)


def per_prompt(target, draft, contexts, top_p: float) -> dict[str, np.ndarray]:
    """Sums of `law_metrics` over each context's generated positions (each predicted from the
    prefix before it), (P,) per metric, and `n`, the positions per context."""
    sums: dict[str, list] = {"n": []}
    for ids, seq in contexts:
        sl = slice(len(ids) - 1, len(seq) - 1)
        m = law_metrics(_logits(target, seq)[sl], _logits(draft, seq)[sl], top_p)
        sums["n"].append(len(seq) - len(ids))
        for k, v in m.items():
            sums.setdefault(k, []).append(float(v.sum()))
    return {k: np.asarray(v, np.float64) for k, v in sums.items()}


def context_metrics(target, draft, contexts, top_p: float) -> dict:
    """Means of `law_metrics` over every generated position of `contexts`."""
    return summarise(per_prompt(target, draft, contexts, top_p), top_p)


def summarise(pp: dict[str, np.ndarray], top_p: float) -> dict:
    """Position-weighted means of a `per_prompt` result."""
    n = max(pp["n"].sum(), 1.0)
    return {
        "positions": int(pp["n"].sum()),
        f"accept_T1_topp{top_p:g}": round(pp["accept"].sum() / n, 4),
        "greedy_top1": round(pp["greedy"].sum() / n, 4),
        "tv_T1": round(pp["tv"].sum() / n, 4),
        "kl_T1": round(pp["kl"].sum() / n, 4),
    }


def paired_diff(a: dict, b: dict, key: str, n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean of `key` under `a` minus under `b` (per_prompt outputs on the SAME contexts) and a
    95 % percentile bootstrap interval that resamples contexts, the same draw for both."""
    from apps.bench.bootstrap import prompt_ci

    assert np.array_equal(a["n"], b["n"]), "paired only on the same contexts"
    n, d = a["n"], a[key] - b[key]
    lo, hi = prompt_ci(
        lambda p: d[p].sum() / max(n[p].sum(), 1), len(n), n_boot, np.random.default_rng(seed)
    )
    return {"diff": round(d.sum() / max(n.sum(), 1), 4), "ci95": [round(lo, 4), round(hi, 4)]}


def window_metrics(target, draft, windows: list[np.ndarray]) -> dict:
    """Held-out corpus windows (each seq_len + 1 ids): mean KL, TV and top-1 agreement at T = 1
    over their first seq_len positions."""
    acc: dict[str, list] = {}
    for w in windows:
        seq = w[:-1].tolist()
        for k, v in law_metrics(_logits(target, seq), _logits(draft, seq), 1.0).items():
            acc.setdefault(k, []).append(v)
    m = {k: float(np.concatenate(v).mean()) for k, v in acc.items()} if acc else {}
    return {
        "heldout_tokens": int(sum(len(w) - 1 for w in windows)),
        "heldout_kl": round(m.get("kl", float("nan")), 4),
        "heldout_tv": round(m.get("tv", float("nan")), 4),
        "heldout_top1": round(m.get("greedy", float("nan")), 4),
    }


def evaluate_draft(tdir: Path, ddir: Path, held: np.ndarray, seq_len: int, a, compare=None) -> dict:
    """The metrics above of the saved draft `ddir` against `tdir` (runtime PyTorch backend),
    with draft-tune's evaluation flags `a`; with `compare` (another draft dir), its metrics
    too and the paired differences."""
    from apps.bench.prompt_set import load_prompts, turn_ids
    from runtime.backends import load_model as load_runtime
    from runtime.chat_session import ChatTemplate
    from runtime.tokenizer import Tokenizer

    t0 = time.monotonic()
    target = load_runtime(tdir, "torch", threads=a.threads)
    tok, tmpl = Tokenizer(tdir), ChatTemplate.load(tdir)
    recs = load_prompts(a.prompts, limit=a.eval_prompts)
    ids = [turn_ids(tok, tmpl, r["turns"][:1], []) for r in recs]
    ctx = sampled_contexts(target, ids, a.eval_tokens, a.eval_top_p)
    greedy = sampled_contexts(target, ids, a.eval_tokens, 1.0, temp=0.0)
    windows = eval_windows(held, seq_len, a.eval_heldout_tokens)
    common = {
        "target": str(tdir),
        "prompts": len(ids),
        "tokens_per_prompt": a.eval_tokens,
        "top_p": a.eval_top_p,
        "contexts_sha": contexts_sha(ctx),
        "greedy_contexts_sha": contexts_sha(greedy),
    }

    def measure(d: Path):
        draft = load_runtime(d, "torch", threads=a.threads)
        pp = per_prompt(target, draft, ctx, a.eval_top_p)
        pg = per_prompt(target, draft, greedy, 1.0)
        rep = {
            "draft": str(d),
            **summarise(pp, a.eval_top_p),
            "greedy_top1_T0_contexts": summarise(pg, 1.0)["greedy_top1"],
            "greedy_ctx_positions": int(pg["n"].sum()),
            **window_metrics(target, draft, windows),
        }
        return rep, pp, pg

    rep, pp, pg = measure(ddir)
    rep = {**common, **rep}
    if compare is not None:
        crep, cpp, cpg = measure(compare)
        acc = f"accept_T1_topp{a.eval_top_p:g}"
        rep["compare"] = crep
        rep["draft_minus_compare"] = {
            acc: paired_diff(pp, cpp, "accept"),
            "greedy_top1": paired_diff(pp, cpp, "greedy"),
            "tv_T1": paired_diff(pp, cpp, "tv"),
            "kl_T1": paired_diff(pp, cpp, "kl"),
            "greedy_top1_T0_contexts": paired_diff(pg, cpg, "greedy"),
        }
    rep["eval_wall_s"] = round(time.monotonic() - t0, 1)
    return rep
