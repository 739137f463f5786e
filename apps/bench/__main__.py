"""`python -m apps.bench`: Duet vs target-alone, mlx-lm and HF assisted generation, one process.

    python -m apps.bench --limit 20 --max-tokens 128 --temps 0,1 --json
    python -m apps.bench --methods ar,sd,mlx-lm --out answers/   # Spec-Bench answer files
    python -m apps.bench --edge --links 5g,4g,wifi-weak          # edge-cloud (apps/bench/edge.py)
    python -m apps.bench --methods ar,sd --drafts mtp            # sd+mtp: the target's MTP head
    python -m apps.bench --methods ar,sd,mirror --gammas 2,4     # sd@g2, sd@g4, ...: a γ sweep
    python -m apps.bench footprint --target smollm2-135m-instruct  # ar vs HF: tok/s, peak RSS
    python -m apps.bench --target smollm2-135m-instruct --peers all --threads 2 --per-category
                                                       # llama.cpp, ort-genai, HF, mlx-lm rows

Defaults: the embedded pair and the held-out prompt set in apps/prompts/.
Methods: any of runtime.decoding.METHODS, plus `mlx-lm` (speculative_generate_step)
and `hf-assisted` (transformers assisted generation); `ar` always runs, it is
the baseline for speedups and for the greedy equality check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from runtime.arg_rules import check_gamma, check_max_tokens
from runtime.cli_args import (
    AUTO,
    add_auto_args,
    add_method_args,
    add_pair_args,
    auto_chooser,
    auto_options,
    load_pair_from_args,
    method_kwargs,
    resolve_gamma,
)
from runtime.decoding import METHODS
from runtime.errors import DuetError, cli_main

from .categories import add_category_args
from .runners.peers import add_peer_args

BASELINES = ("mlx-lm", "hf-assisted", "hf")
NEEDS_NO_DRAFT = ("ar", AUTO, "mlx-lm", "hf")  # with a target alone: mlx-lm and auto run it alone
ALONE_METHODS = "ar,hf,mlx-lm"  # the default rows for a target alone (--target, no --draft)
UNPADDED = "its own generation loop calls the model directly, so its passes cannot be padded"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m apps.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_pair_args(ap)
    ap.add_argument("--hybrid", nargs="?", const="", default=None, metavar="DIR",
                    help="bench the hybrid Qwen3.5 pair built by `python -m apps.train --arch "
                    "qwen3_5` (DIR/target, DIR/draft; default out/hybrid): the target on "
                    "PyTorch, the draft on --draft-backend (default onnx, as runtime.generate "
                    "runs it); a missing pair is answered with the command that builds it")  # fmt: skip
    ap.add_argument(
        "--prompts",
        default=None,
        help="prompt set .jsonl or folder, or `chat` (Spec-Bench's six categories for chat "
        "models, apps/prompts/chat/) (default apps/prompts/)",
    )
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    add_category_args(ap)
    ap.add_argument("--categories", default=None, help="comma-separated categories to keep")
    ap.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated, from {', '.join((*METHODS, AUTO, *BASELINES))}; auto: the "
        "method the latency model predicts fastest, per prompt; hf: Hugging Face generate, the "
        "target alone (default: ar,sd,mirror,mlx-lm,hf-assisted; with --target and no --draft, "
        f"{ALONE_METHODS})",
    )
    add_auto_args(ap)
    add_peer_args(ap)
    ap.add_argument(
        "--drafts",
        default=None,
        help="more drafts, comma-separated (`mtp`: the target's own MTP head, `mtp-fp32`: its "
        "float32 ONNX step, or a path): every "
        "drafting method also runs with each, as METHOD+NAME, alternated (apps/bench/drafts.py)",
    )
    ap.add_argument(
        "--gammas",
        default=None,
        metavar="G1,G2,...",
        help="sweep γ instead: every method that takes γ runs once per value, as METHOD@gG "
        "(ar, tree and heterospec once), alternated in one run (Mirror-SD Fig. 3: latency "
        "against draft size x γ)",
    )
    add_method_args(ap)  # --gamma and the methods' own flags (--kappa, --tree-k, ...)
    ap.add_argument("--temps", default="0,1", help="comma-separated temperatures (default 0,1)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0 = off)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per turn (default 128)")
    ap.add_argument("--seed", type=int, default=0, help="base seed; prompt i uses seed + i")
    ap.add_argument("--samples", type=int, default=1,
                    help="draws per prompt at T > 0 (draw k: seed + i + k * prompts), pooled in "
                         "the rows: one draw compares methods on different sampled texts "
                         "(default 1)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole alternated schedule this many times, pooled in the "
                         "rows (the same texts; the runner order rotated each round): for goals "
                         "of a few percent on a noisy machine (default 1)")  # fmt: skip
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    ap.add_argument(
        "--emulate",
        metavar="PROFILE[:MODEL][,real-vocab]",
        help="pad Duet's target and draft passes to a device profile (python -m devices list); "
        "the mlx-lm and HF baselines cannot be padded and are skipped; output labelled emulated; "
        "append ',real-vocab' to pad the logits to the emulated target's vocabulary as well",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--json-out", default=None, metavar="FILE",
                    help="also write that JSON object (settings, rows, per-category rows, "
                    "mismatches) to FILE, beside the table")  # fmt: skip
    ap.add_argument(
        "--out", default=None, help="write Spec-Bench answer JSONL files to this folder"
    )
    ap.add_argument(
        "--model-id", default=None, help="model_id in the answer files (default: target folder)"
    )
    return ap


def parse_methods(text: str) -> list[str]:
    ms = [m.strip() for m in text.split(",") if m.strip()]
    known = (*METHODS, AUTO, *BASELINES)
    bad = [m for m in ms if m not in known]
    if bad:
        raise DuetError(f"--methods: unknown {', '.join(bad)}; choose from {', '.join(known)}")
    return ["ar"] + [m for m in dict.fromkeys(ms) if m != "ar"]


def parse_numbers(text: str, flag: str, cast, least) -> list:
    """A comma-separated `flag` value as numbers >= `least` (DuetError otherwise)."""
    kind = "integers" if cast is int else "numbers"
    try:
        xs = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DuetError(f"{flag} must be comma-separated {kind}, got {text!r}") from None
    if not xs or any(x < least for x in xs):
        raise DuetError(f"{flag} must be {kind} >= {least}, got {text!r}")
    return xs


def parse_temps(text: str) -> list[float]:
    return parse_numbers(text, "--temps", float, 0)


def parse_gammas(text: str | None, default: int) -> list[int]:
    """`--gammas` as distinct values >= 1, or [default] when not given."""
    if text is None:
        return [default]
    return list(dict.fromkeys(parse_numbers(text, "--gammas", int, 1)))


def sweep_runners(methods: list[str], pair, a) -> list:
    """The runners of `methods` (and of every --drafts draft), once per γ of --gammas; with more
    than one γ, each drafting runner is named METHOD@gG (ar runs once)."""
    from copy import copy

    from runtime.drafts import is_model_free_spec
    from runtime.drafts.mixed import is_mixed_spec

    from .drafts import extra_runners, label

    gammas = parse_gammas(getattr(a, "gammas", None), a.gamma)
    runners, pairs = [], {}
    for i, g in enumerate(gammas):
        ag = copy(a)
        ag.gamma = g
        # ar, the methods that take no γ (tree, heterospec: --depth) and an auto that picks
        # its own γ (no --gamma) run once, unsuffixed
        ms = methods if i == 0 else [m for m in methods if sweeps(m, a)]
        if not ms:  # nothing here takes γ (e.g. ar,tree): one pass is the whole sweep
            break
        rs = make_runners(ms, pair, ag)
        if is_model_free_spec(a.draft) or is_mixed_spec(a.draft):  # sd+lookup, sd+head+suffix
            for r in rs:
                if r.name not in ("ar", AUTO, *BASELINES):
                    r.name = f"{r.name}+{label(a.draft)}"
        rs += extra_runners(ms, pair, ag, make_runners, skip=(*BASELINES, AUTO), pairs=pairs)
        if len(gammas) > 1:
            for r in rs:
                if sweeps(getattr(r, "method", r.name), a):
                    r.name = f"{r.name}@g{g}"
        runners += rs
    return runners


def sweeps(method: str, a) -> bool:
    """Does --gammas run `method` once per γ? Not ar, tree, heterospec, nor a free auto."""
    if method == AUTO and getattr(a, "gamma_free", False):
        return False
    return takes_gamma(method)


def takes_gamma(method: str) -> bool:
    """Does `method` draft γ tokens per step (so --gammas sweeps it)?"""
    from dataclasses import fields

    from runtime.decoding import method_module

    if method in ("ar", "hf"):
        return False
    if method in BASELINES or method == AUTO:
        return True
    return "gamma" in {f.name for f in fields(method_module(method).Options)}


def make_runners(methods: list[str], pair, a) -> list:
    from .runners.duet import DuetRunner

    runners = []
    for m in methods:
        if m == "mlx-lm":
            from .runners.mlx_lm import MlxLmRunner

            runners.append(MlxLmRunner(pair, gamma=a.gamma))
        elif m in ("hf-assisted", "hf"):
            from .runners.hf import HfAssistedRunner

            runners.append(HfAssistedRunner(pair, gamma=a.gamma, alone=m == "hf"))
        else:
            options = {k: v for k, v in method_kwargs(a).items() if k != "gamma"}
            chooser = auto_chooser(auto_options(a), pair) if m == AUTO else None
            runners.append(DuetRunner(m, pair, gamma=a.gamma, chooser=chooser, **options))
    return runners


def thread_settings(runners: list) -> dict:
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mlx_device": mlx_device(),
        "runners": {r.name: r.settings() for r in runners},
    }


def mlx_device() -> str | None:
    """MLX's default device, or None where MLX is not installed (a CUDA machine)."""
    try:
        import mlx.core as mx
    except ImportError:
        return None
    return str(mx.default_device())


def bench(a: argparse.Namespace) -> dict:
    """Run the benchmark; returns {"settings", "rows", "mismatches", "records"}."""
    from runtime.chat_session import ChatTemplate

    from .categories import by_category
    from .runners.peers import (
        bench_threads,
        close_runners,
        parse_peers,
        peer_runners,
        second_backend_runners,
    )
    from .prompt_set import load_prompts
    from .report import mismatches, summarize
    from .schedule import run_bench

    alone = a.target is not None and a.draft is None and not a.drafts and a.hybrid is None
    default = ALONE_METHODS if alone else "ar,sd,mirror,mlx-lm,hf-assisted"
    methods, temps = parse_methods(a.methods or default), parse_temps(a.temps)
    if alone and (need := [m for m in methods if m not in NEEDS_NO_DRAFT]):
        raise DuetError(f"--methods {','.join(need)} needs a draft: pass --draft (a target alone "
                        f"runs {', '.join(NEEDS_NO_DRAFT)})")  # fmt: skip
    check_max_tokens(a.max_tokens)
    resolve_gamma(a)  # no --gamma: 4 for every method, and a free γ for auto
    check_gamma(a.gamma)
    gammas = parse_gammas(a.gammas, a.gamma)  # a bad --gammas fails before any model loads
    if a.limit is not None and a.limit < 1:
        raise DuetError(f"--limit must be at least 1 (got {a.limit})")
    if a.samples < 1:
        raise DuetError(f"--samples must be at least 1 (got {a.samples})")
    if a.rounds < 1:
        raise DuetError(f"--rounds must be at least 1 (got {a.rounds})")
    cats = [c.strip() for c in a.categories.split(",")] if a.categories else None
    prompts = load_prompts(a.prompts, limit=a.limit, categories=cats,
                           per_category=a.per_category_limit)  # fmt: skip
    peer_names = parse_peers(a.peers)
    threads = bench_threads(a)  # --threads: Duet's target, PyTorch and every peer alike
    skipped = {}
    if a.emulate:  # only Duet's own models can be wrapped; the baselines run their own loops
        skipped = {m: UNPADDED for m in methods if m in BASELINES}
        methods = [m for m in methods if m not in BASELINES]
        for m, why in skipped.items():
            print(f"skipping {m} under --emulate: {why}", file=sys.stderr)
    if a.hybrid is not None:  # the hybrid pair (apps/bench/hybrid_pair.py): a torch target, and
        from .hybrid_pair import hybrid_pair_dirs  # the draft where runtime.generate runs it

        t, d = hybrid_pair_dirs(a.hybrid or None)
        a.target, a.draft, a.target_backend = str(t), str(d), "torch"
    need = any(m not in NEEDS_NO_DRAFT for m in methods) or (not alone and len(methods) > 1)
    pair = load_pair_from_args(a, need_draft=need or bool(a.drafts))
    if pair.tokenizer is None:
        raise DuetError(f"{pair.target_dir}: no tokenizer.json; the bench needs one")
    emu = None
    if a.emulate:
        from devices.emulated_model import emulate_pair

        emu, pair.target, pair.draft = emulate_pair(a.emulate, pair.target, pair.draft)
    runners = sweep_runners(methods, pair, a)
    if a.also_target_backend:  # Duet's methods again over a second target backend
        runners += second_backend_runners(methods, a, sweep_runners, need or bool(a.drafts))
    if emu is not None:  # the peers run their own loops: nothing to pad
        skipped |= {f"{x}:ar": UNPADDED for x in peer_names}
        peer_names = []
    peers, peer_skips = peer_runners(peer_names, pair, a, threads)
    skipped |= peer_skips
    for m, why in peer_skips.items():
        print(f"skipping {m}: {why}", file=sys.stderr)
    runners += peers
    ctx = min(
        [pair.target.config.max_context]
        + ([pair.draft.config.max_context] if pair.draft is not None else [])
    )
    try:
        records = run_bench(
            runners,
            prompts,
            pair.tokenizer,
            ChatTemplate.load(pair.target_dir),
            temps=temps,
            top_p=a.top_p,
            max_new=a.max_tokens,
            seed=a.seed,
            context=ctx,
            warmup=not a.no_warmup,
            samples=a.samples,
            rounds=a.rounds,
        )
    finally:  # mirror's draft processes, if it ran any: nothing of the run is left running
        from runtime.mirror.draft_process import close_draft_hosts

        drafts = [getattr(getattr(r, "pair", None), "draft", None) for r in runners]
        close_draft_hosts(pair.draft, *drafts)
        close_runners(runners)  # the peers' llama-server processes
    model_id = a.model_id or (
        f"duet-{pair.target_dir.parent.name}" if a.target is None else pair.name
    )
    settings = {
        "model_id": model_id,
        "target": str(pair.target_dir),
        "draft": str(pair.draft_path),
        "prompts": len(prompts),
        "max_tokens": a.max_tokens,
        "gamma": a.gamma,
        "gammas": gammas,
        "temps": temps,
        "samples": a.samples,
        "rounds": a.rounds,
        "top_p": a.top_p,
        "threads": thread_settings(runners),
        **{k: pair.settings[k] for k in ("target_backend", "draft_backend") if k in pair.settings},
    }
    own_ar = {r.name: getattr(r, "own_ar", "ar") for r in runners}
    rows = summarize(records, [r.name for r in runners], temps, own_ar)
    settings["threads"]["bench_threads"] = threads
    if skipped:
        settings["skipped"] = skipped
    if emu is not None:
        settings.update(emulated=emu.label, skipped=skipped, emulation=emu.summary())
        for r in rows:
            r["emulated"] = emu.label
    return {
        "settings": settings,
        "rows": rows,
        "categories": by_category(records, [r.name for r in runners], temps, own_ar),
        "mismatches": mismatches(records),
        "records": records,
    }


@cli_main
def main(argv: list[str] | None = None) -> int:
    from .categories import category_report
    from .report import table
    from .specbench import write_answers

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--edge" in argv:  # FlexSpec edge-cloud baselines (apps/bench/edge.py)
        from .edge import main as edge_main

        return edge_main([x for x in argv if x != "--edge"])
    if argv[:1] == ["footprint"]:  # ar against HF generate, one process each: tok/s, peak RSS
        from .footprint import main as footprint_main

        return footprint_main(argv[1:])
    if argv[:1] == ["evolving"]:  # FlexSpec Table II: generic vs anchor draft on evolved targets
        from .evolving import main as evolving_main

        return evolving_main(argv[1:])
    a = build_parser().parse_args(argv)
    if a.out:  # before the run, not after it
        from runtime.preflight import writable_dir

        writable_dir(a.out, "--out")
    if a.json_out and not os.path.isdir(os.path.dirname(os.path.abspath(a.json_out))):
        raise DuetError(f"--json-out {a.json_out}: its folder does not exist")
    res = bench(a)
    if a.out:
        files = write_answers(a.out, res["records"], res["settings"]["model_id"])
        print(f"wrote {len(files)} Spec-Bench answer files to {a.out}", file=sys.stderr)
    out = {k: res[k] for k in ("settings", "rows", "categories", "mismatches")}
    if "emulated" in res["settings"]:
        out = {"emulated": res["settings"]["emulated"]} | out
    if a.json_out:
        from pathlib import Path

        Path(a.json_out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.json_out}", file=sys.stderr)
    if a.json:
        print(json.dumps(out))
        return 0
    s = res["settings"]
    if "emulated" in s:
        print(f"{s['emulated']}: Duet's stages padded to the profile, not measured on it")
    print(
        f"{s['model_id']}: {s['prompts']} prompts, max {s['max_tokens']} tokens, gamma {s['gamma']}"
    )
    print(f"threads: {json.dumps(s['threads'])}")
    print(table(res["rows"]))
    if extra := category_report(res, a.per_category):  # Spec-Bench's table, skipped peers
        print(extra)
    for m in res["mismatches"]:
        print(
            f"greedy mismatch: {m['method']} on question {m['question_id']} differs from "
            f"{m.get('own_ar', 'ar')} "
            f"at token {m['first_diff']}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
