r"""`python -m apps.train bins`: fit HeteroSpec's entropy bins for a target/draft pair.

Runs the `tree` method over prompts, recording per step Φ(P*) of the base tree (eq. 1,
runtime/decoding/heterospec.path_entropy) and the Terminal Confidence Rank of the
accepted path (steps that accepted at least one draft token: the paper's accepted paths),
then fits a depth-3 CART regression tree TCR ~ Φ (scikit-learn's DecisionTreeRegressor,
whose split criterion is eq. 2's within-partition variance) and writes its split points:
8 bins ordered by Φ, bin 0 the lowest-entropy. scikit-learn is used rather than a
hand-written CART because it is the reference implementation of exactly that criterion.

By default the first 10 prompts of the set (what `apps.bench --limit 10` measures) are
skipped, so bins are never fitted on the prompts they are benchmarked on; on a set with
categories, `--skip-per-category K` skips what `--per-category-limit K` measures instead.

For a real target's fitted head, written where `heterospec --draft head` finds them:
    python -m apps.train bins --target smollm2-135m-instruct --target-backend onnx --draft head \
        --prompts chat --skip-per-category 2 --limit 34 \
        --out ~/.cache/duet/models/smollm2-135m-instruct/checkpoint/.duet/eagle/bins.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from runtime.cli_args import add_pair_args, load_pair_from_args
from runtime.decoding.events import Sampling
from runtime.decoding.heterospec import path_entropy
from runtime.decoding.tree import tree_steps
from runtime.errors import DuetError, cli_main

from .args import command_parser


def collect(
    pair,
    prompts: list[list[int]],
    *,
    max_new: int,
    top_k: int,
    top_n: int,
    depth: int,
    temp: float,
    expand: int = 1,
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(Φ, TCR, accepted length) of every step that accepted a path, and every step's
    accepted length."""
    phis, ranks, lengths, accepted = [], [], [], []

    def record(drafter, n, room, budget):
        return n, {"phi": path_entropy(drafter, top_k)}

    from tqdm import tqdm

    for i, ids in enumerate(tqdm(prompts, desc="bins", unit="prompt", file=sys.stderr)):
        steps = tree_steps(
            pair.target,
            pair.draft,
            ids,
            max_new=max_new,
            top_k=top_k,
            top_n=top_n,
            depth=depth,
            expand=expand,
            sampling=Sampling(temp),
            rng=np.random.default_rng(i),
            shape=record,
        )
        produced = 0
        for ev in steps:
            s = ev.extra["per_step"]
            accepted.append(s["accepted"])
            if s.get("tcr") is not None:
                phis.append(s["phi"])
                ranks.append(s["tcr"])
                lengths.append(s["accepted"])
            produced += len(ev.tokens)
            if produced >= max_new:
                break
        steps.close()
    return np.array(phis), np.array(ranks, dtype=np.float64), np.array(lengths), accepted


def fit_bins(
    phi: np.ndarray,
    tcr: np.ndarray,
    lengths: np.ndarray,
    max_depth: int = 3,
    min_leaf: float = 0.05,
) -> dict:
    """CART over Φ (eq. 2): sorted split points, and per bin the mean TCR, the mean accepted
    length and the count. A leaf holds at least `min_leaf` of the paths, so that no bin is a
    single outlier (the paper fits on a corpus large enough not to need this)."""
    from sklearn.tree import DecisionTreeRegressor

    if len(phi) < 2**max_depth:
        raise DuetError(
            f"only {len(phi)} accepted paths: too few to fit {2**max_depth} bins; "
            "use more prompts or --max-tokens"
        )
    cart = DecisionTreeRegressor(
        max_depth=max_depth, min_samples_leaf=max(1, int(min_leaf * len(phi))), random_state=0
    )  # eq. (2): variance-minimizing splits
    cart.fit(phi.reshape(-1, 1), tcr)
    t = cart.tree_
    thresholds = sorted(float(x) for x, f in zip(t.threshold, t.feature, strict=True) if f >= 0)
    b = np.searchsorted(np.array(thresholds), phi, side="right")
    return {
        "thresholds": [round(x, 6) for x in thresholds],
        "bin_mean_tcr": [
            round(float(tcr[b == i].mean()), 3) if (b == i).any() else None
            for i in range(len(thresholds) + 1)
        ],
        "bin_mean_accepted": [
            round(float(lengths[b == i].mean()), 3) if (b == i).any() else None
            for i in range(len(thresholds) + 1)
        ],
        "bin_count": [int((b == i).sum()) for i in range(len(thresholds) + 1)],
        "paths": int(len(phi)),
    }


def after_each_category(recs: list[dict], k: int) -> list[dict]:
    """The records after the first k of each category (held out from what `apps.bench
    --per-category-limit k` measures)."""
    seen: Counter = Counter()
    kept = []
    for r in recs:
        seen[r["category"]] += 1
        if seen[r["category"]] > k:
            kept.append(r)
    return kept


def build_parser() -> argparse.ArgumentParser:
    paragraphs = __doc__.split("\n\n")  # the last: the recipe for a fitted head
    ap = command_parser("bins", paragraphs[0], epilog=paragraphs[-1])
    add_pair_args(ap)
    ap.add_argument("--out", required=True, help="bins JSON to write")
    ap.add_argument("--prompts", default=None, help="prompt .jsonl (default apps/prompts/)")
    ap.add_argument(
        "--skip",
        type=int,
        default=None,
        help="prompts skipped first (default 10, or 0 with --skip-per-category)",
    )
    ap.add_argument(
        "--skip-per-category",
        type=int,
        default=0,
        metavar="K",
        help="skip the first K prompts of each category: what `apps.bench "
        "--per-category-limit K` measures (e.g. --prompts chat)",
    )
    ap.add_argument("--limit", type=int, default=30, help="prompts used (default 30)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    # defaults: the tree method's (runtime/decoding/tree.py Options), which the bins serve
    ap.add_argument("--tree-k", type=int, default=2, help="tree top-K (default 2)")
    ap.add_argument("--expand", type=int, default=1, help="nodes expanded per level (default 1)")
    ap.add_argument("--top-n", type=int, default=12, help="tree top-N (default 12)")
    ap.add_argument("--depth", type=int, default=6, help="base tree depth (default 6)")
    ap.add_argument("--temp", type=float, default=0.0, help="sampling temperature (default 0)")
    ap.add_argument(
        "--save-paths", default=None, help="also write the (Φ, TCR, accepted) rows here (JSON)"
    )
    ap.add_argument(
        "--from-paths", default=None, help="refit from rows saved by --save-paths; runs no model"
    )
    ap.add_argument("--plot", default=None, help="also write the fidelity chart (SVG) here")
    ap.add_argument(
        "--min-leaf",
        type=float,
        default=0.05,
        help="smallest bin, as a fraction of the paths (default 0.05)",
    )
    return ap


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.skip is None:
        a.skip = 0 if a.skip_per_category else 10
    if a.skip < 0 or a.skip_per_category < 0 or a.limit < 1 or a.max_tokens < 1:
        raise DuetError(
            "--skip and --skip-per-category must be >= 0, --limit and --max-tokens >= 1"
        )
    t0 = time.perf_counter()
    # the tree the paths are walked with, recorded beside the bins it fits
    tree = dict(top_k=a.tree_k, expand=a.expand, top_n=a.top_n, depth=a.depth, temp=a.temp)
    paths = read_paths(a.from_paths) if a.from_paths else walk_paths(a, tree)
    phi, tcr, lengths, accepted = (paths[k] for k in ("phi", "tcr", "accepted", "steps_accepted"))
    bins = fit_bins(phi, tcr, lengths, min_leaf=a.min_leaf)
    # HeteroSpec §3.2's heterogeneity: how concentrated the accepted paths' ranks are
    bins["tcr_top_quartile_share"] = round(float((tcr <= max(1, a.top_n / 4)).mean()), 3)
    bins.update(
        **tree,
        prompts=paths["prompts"],
        skip=a.skip,
        max_tokens=a.max_tokens,
        steps=len(accepted),
        mean_accepted=round(float(np.mean(accepted)), 3),
        target=paths["target"],
        min_leaf=a.min_leaf,
        fit_s=round(time.perf_counter() - t0, 1),
    )
    Path(a.out).write_text(json.dumps(bins, indent=1) + "\n")
    if a.plot:
        from .bins_plot import fidelity_svg

        Path(a.plot).write_text(fidelity_svg(tcr, lengths, phi, bins))
    keys = (
        "thresholds",
        "bin_mean_tcr",
        "bin_mean_accepted",
        "bin_count",
        "tcr_top_quartile_share",
    )
    print(json.dumps({k: bins[k] for k in keys}))
    return 0


PATH_ARRAYS = ("phi", "tcr", "accepted")  # a path's Φ, TCR and accepted length, one per step


def read_paths(path: str) -> dict:
    """The rows a --save-paths run wrote, as `walk_paths` returns them (phi, tcr and accepted
    as float arrays)."""
    try:
        rows = json.loads(Path(path).read_text())
        for k in PATH_ARRAYS:
            rows[k] = np.array(rows[k], dtype=np.float64)
        rows = {k: rows[k] for k in (*PATH_ARRAYS, "steps_accepted", "target", "prompts")}
    except (OSError, ValueError, KeyError) as e:
        raise DuetError(f"--from-paths {path}: not a file from --save-paths ({e})") from None
    return rows


def walk_paths(a: argparse.Namespace, tree: dict) -> dict:
    """Run the pair's tree over the chosen prompts: the rows `read_paths` reads back (also
    written to --save-paths when given)."""
    from apps.bench.prompt_set import load_prompts, turn_ids

    pair = load_pair_from_args(a, need_draft=True)
    if pair.tokenizer is None:
        raise DuetError("bins need a tokenizer to encode the prompts (none found with the target)")
    recs = after_each_category(load_prompts(a.prompts), a.skip_per_category)
    recs = recs[a.skip : a.skip + a.limit]
    if not recs:
        raise DuetError(f"no prompts left after --skip {a.skip}")
    ids = [turn_ids(pair.tokenizer, None, r["turns"], []) for r in recs]
    phi, tcr, lengths, accepted = collect(pair, ids, max_new=a.max_tokens, **tree)
    rows = {
        "phi": phi,
        "tcr": tcr,
        "accepted": lengths,
        "steps_accepted": accepted,
        "target": os.path.relpath(pair.target_dir),
        "prompts": len(ids),
    }
    if a.save_paths:
        listed = {k: v.tolist() if k in PATH_ARRAYS else v for k, v in rows.items()}
        Path(a.save_paths).write_text(json.dumps(listed))
    return rows


if __name__ == "__main__":
    sys.exit(main())
