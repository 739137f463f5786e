"""Evaluating a trained pair: held-out loss and the draft's greedy acceptance.

Held-out loss is the mean cross-entropy per token over non-overlapping windows
of the held-out token stream. Greedy acceptance: for each held-out prompt the
target generates its greedy continuation; at every position of it we ask
whether the draft's argmax, given the same prefix, equals the target's token.
That is exactly the per-token acceptance of greedy speculative decoding, and
walking the match sequence in windows of gamma gives the mean accepted length
that `sd` would see. Models are evaluated as saved (bf16 weights, float32 math).

    python -m apps.train.evaluate DIR   # DIR holds target/, draft/ and split.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from runtime.errors import DuetError, cli_main

from .checkpoint import load_model
from .corpus import Corpus, corpus_from_split, eval_windows, token_stream
from .prompts import build_prompts
from .tokenizer import eos_id, load_tokenizer


@torch.no_grad()
def heldout_loss(model, windows: list[np.ndarray]) -> float:
    """Mean next-token cross-entropy (nats/token) over `windows` (each seq_len+1 ids)."""
    total, n = 0.0, 0
    dev = next(model.parameters()).device
    for w in windows:
        x = torch.from_numpy(w[None, :-1]).to(dev)
        y = torch.from_numpy(w[None, 1:]).to(dev)
        logits = model(input_ids=x).logits.float()
        total += torch.nn.functional.cross_entropy(logits[0], y[0], reduction="sum").item()
        n += y.numel()
    return total / max(n, 1)


@torch.no_grad()
def greedy_continuation(model, ids: list[int], max_new: int, eos: int) -> list[int]:
    """The model's greedy continuation of `ids`, up to `max_new` tokens, stopping after EOS."""
    x = torch.tensor([ids])
    out = model.generate(
        x,
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos,
        attention_mask=torch.ones_like(x),
    )
    return out[0, len(ids) :].tolist()


def accepted_lengths(matches: list[bool], gamma: int) -> list[int]:
    """Accepted draft tokens per step of greedy SD with window `gamma`, given per-position matches.

    Each step the draft proposes gamma tokens; the first mismatch ends the step
    and the target's token there is committed for free (so a step advances A + 1).
    """
    out, i = [], 0
    while i < len(matches):
        a = 0
        while a < gamma and i + a < len(matches) and matches[i + a]:
            a += 1
        out.append(a)
        i += a + 1
    return out


@torch.no_grad()
def greedy_acceptance(
    target, draft, tok, prompts: list[dict], max_new: int = 64, gamma: int = 4
) -> dict:
    """Per-token greedy acceptance of `draft` against `target` on `prompts` (Spec-Bench records)."""
    eos = eos_id(tok)
    matches_all, by_cat, steps = [], {}, []
    for rec in tqdm(prompts, desc="acceptance", unit="prompt", file=sys.stderr, mininterval=10):
        ids = tok.encode(rec["turns"][0]).ids
        cont = greedy_continuation(target, ids, max_new, eos)
        if not cont:
            continue
        seq = torch.tensor([ids + cont])
        pred = draft(input_ids=seq).logits[0, len(ids) - 1 : -1].argmax(-1).tolist()  # (len(cont),)
        m = [p == t for p, t in zip(pred, cont, strict=True)]
        matches_all += m
        by_cat.setdefault(rec["category"], []).extend(m)
        steps += accepted_lengths(m, gamma)
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new,
        "positions": len(matches_all),
        "greedy_acceptance": float(np.mean(matches_all)) if matches_all else 0.0,
        "by_category": {c: round(float(np.mean(v)), 4) for c, v in sorted(by_cat.items())},
        f"mean_accepted_gamma{gamma}": float(np.mean(steps)) if steps else 0.0,
        f"tokens_per_target_call_gamma{gamma}": float(np.mean(steps)) + 1 if steps else 0.0,
    }


def evaluate_pair(
    target_dir: Path,
    draft_dir: Path,
    corpus: Corpus,
    *,
    seq_len: int = 512,
    max_eval_tokens: int = 32768,
    max_new: int = 64,
    max_prompts: int | None = None,
    prompts: list[dict] | None = None,
) -> dict:
    """Load the saved pair and measure held-out loss of both and greedy acceptance."""
    t0 = time.monotonic()
    tok = load_tokenizer(target_dir)
    if load_tokenizer(draft_dir).get_vocab() != tok.get_vocab():
        raise DuetError(f"{draft_dir} and {target_dir} have different tokenizers")
    target, draft = load_model(target_dir), load_model(draft_dir)
    stream = token_stream(
        corpus.texts("heldout"), lambda t: [e.ids for e in tok.encode_batch(t)], eos_id(tok)
    )
    windows = eval_windows(stream, seq_len, max_eval_tokens)
    if prompts is None:
        prompts = build_prompts(corpus)
    prompts = prompts[:max_prompts]
    report = {
        "heldout_files": len(corpus.heldout),
        "heldout_tokens_evaluated": int(sum(len(w) - 1 for w in windows)),
        "target_heldout_loss": heldout_loss(target, windows),
        "draft_heldout_loss": heldout_loss(draft, windows),
        **greedy_acceptance(target, draft, tok, prompts, max_new=max_new),
    }
    report["eval_wall_s"] = round(time.monotonic() - t0, 1)
    return report


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m apps.train.evaluate",
        description="Held-out loss of a target/draft pair and the draft's greedy acceptance.",
    )
    ap.add_argument(
        "dir", help="directory with target/, draft/ and split.json (as written by apps.train)"
    )
    ap.add_argument(
        "--corpus", default=None, help="corpus root (default: the one recorded in split.json)"
    )
    ap.add_argument(
        "--max-new-tokens", type=int, default=64, help="target tokens per prompt (default 64)"
    )
    ap.add_argument(
        "--max-prompts", type=int, default=None, help="first N held-out prompts (default: all)"
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument(
        "--write-report",
        action="store_true",
        help="store the result as 'evaluation' in DIR/training_report.json",
    )
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    d = Path(a.dir)
    split_path = d / "split.json"
    for p in (d / "target", d / "draft", split_path):
        if not p.exists():
            raise DuetError(f"{p} not found; is {d} an apps.train output directory?")
    corpus, seq_len = corpus_from_split(split_path, a.corpus)
    rep = evaluate_pair(
        d / "target",
        d / "draft",
        corpus,
        seq_len=seq_len,
        max_new=a.max_new_tokens,
        max_prompts=a.max_prompts,
    )
    print(json.dumps(rep, indent=2))
    report_path = d / "training_report.json"
    if a.write_report and report_path.is_file():
        full = json.loads(report_path.read_text())
        full["evaluation"] = rep
        report_path.write_text(json.dumps(full, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
