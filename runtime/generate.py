"""`python -m runtime.generate`: one prompt through a decoding method.

    python -m runtime.generate --prompt "def fib(n):" --max-tokens 64 --json

The method defaults to auto: the latency model's pick for this pair on this machine (sd,
mirror or ar, and γ unless --gamma is given). Its first run on a pair measures it (seconds)
and keeps the figures per pair and machine (devices/probe_store.py), so later runs choose at
once; --reprobe measures again, --method sd (or any method) skips the choice.

Without --target/--draft it runs the embedded default pair. With --json it
prints one object: {"tokens", "text", "stats"}; otherwise it streams the text
and prints a stats line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from runtime.api import context_of, eos_ids, stream_generate
from runtime.cli_args import (
    AUTO,
    add_auto_args,
    add_gamma_arg,
    add_pair_args,
    add_wave_args,
    auto_announcement,
    auto_chooser,
    check_decoding_args,
    load_pair_from_args,
)
from runtime.decoding import METHODS, Sampling
from runtime.decoding.mirror import draft_in_process
from runtime.edge.cli_args import (
    add_edge_args,
    check_edge_args,
    edge_options,
    load_draft_only,
    needs_local_target,
)
from runtime.errors import DuetError, cli_main
from runtime.mirror.summary import mirror_summary
from runtime.mirror.timeline import Timeline
from runtime.preflight import writable_file
from runtime.stats import RunStats


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m runtime.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_pair_args(ap)
    add_edge_args(ap)
    ap.add_argument("--method", choices=(*METHODS, AUTO), default=AUTO,
                    help="decoding method (default auto: the one the latency model predicts "
                    "fastest for this pair on this machine, γ too when --gamma is not given; "
                    "its first run measures the pair, some seconds, and keeps the figures for "
                    "later runs: see --reprobe)")  # fmt: skip
    add_auto_args(ap)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", help="prompt as comma-separated token ids, e.g. 1,2,3")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens at most (default 128)")
    ap.add_argument(
        "--temp", type=float, default=0.0, help="sampling temperature; 0 = greedy (default 0)"
    )
    ap.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0 = off)"
    )
    ap.add_argument(
        "--top-k", type=int, default=0, help="keep the k most likely tokens (default 0 = off)"
    )
    ap.add_argument("--seed", type=int, default=0, help="RNG seed for sampling (default 0)")
    add_gamma_arg(ap)
    ap.add_argument(
        "--kappa",
        type=int,
        default=8,
        help="mirror: top-κ width of the early-exit message (default 8)",
    )
    add_wave_args(ap)
    ap.add_argument(
        "--exit-layer",
        type=int,
        default=None,
        help="mirror: target layer ℓe whose hidden state gives the early exit (default N/2)",
    )
    ap.add_argument("--tree-k", type=int, default=None,
                    help="tree, heterospec: top-K children per expanded node (default 2)")  # fmt: skip
    ap.add_argument("--expand", type=int, default=None,
                    help="tree, heterospec: nodes expanded per level (default 1: the greedy chain and its siblings; EAGLE-2: --tree-k)")  # fmt: skip
    ap.add_argument("--top-n", type=int, default=None,
                    help="tree, heterospec: nodes kept after reranking, verified per step (default 12)")  # fmt: skip
    ap.add_argument("--depth", type=int, default=None,
                    help="tree, heterospec: tree levels (heterospec: the base depth d_base) (default 6)")  # fmt: skip
    ap.add_argument("--bins", default=None,
                    help="heterospec: entropy bins from `python -m apps.train bins` (default: a fitted head's own TARGET/.duet/eagle/bins.json, else the embedded pair's)")  # fmt: skip
    ap.add_argument("--exit-head", choices=("raw", "tuned"), default=None,
                    help="mirror: the early exit's head: raw, or tuned (python -m apps.train "
                    "exit-head); default tuned when one is stored beside the target")  # fmt: skip
    ap.add_argument(
        "--trace",
        metavar="FILE",
        help="mirror: write a Chrome trace (open in Perfetto) of what target, draft and channel did",
    )
    ap.add_argument(
        "--emulate",
        metavar="PROFILE[:MODEL][,real-vocab]",
        help="pad every stage to a device profile's prediction (see `python -m devices list`); "
        "all timings are then labelled emulated; append ',real-vocab' to pad the logits to the "
        "emulated target's vocabulary as well",
    )
    ap.add_argument(
        "--json", action="store_true", help="print one JSON object instead of streaming text"
    )
    return ap


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise DuetError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    return ids


def check_args(a: argparse.Namespace) -> None:
    """Everything that can be checked before a model loads."""
    check_decoding_args(a)
    if a.draft_process is not None and a.method not in ("mirror", AUTO):
        flag = "--draft-process" if a.draft_process else "--draft-thread"
        raise DuetError(f"{flag} places Mirror-SD's draft worker; use it with --method mirror")
    if a.trace and a.method not in ("mirror", AUTO):
        raise DuetError("--trace records the Mirror-SD timeline; use it with --method mirror")
    if a.trace:
        writable_file(a.trace, "--trace")
    if a.prompt_ids is not None:
        parse_ids(a.prompt_ids)
    if a.emulate:
        from devices.emulation import split_spec
        from devices.profile import load_profile

        load_profile(split_spec(a.emulate)[0])  # as Emulator.from_spec reads it
    if a.method != "ar" and a.gamma < 1:
        raise DuetError(f"--gamma must be at least 1 for --method {a.method} (got {a.gamma})")
    if a.method == "flexspec":
        check_edge_args(a)


def prompt_tokens(a, pair) -> list[int]:
    if a.prompt_ids is not None:
        ids = parse_ids(a.prompt_ids)
    else:
        if pair.tokenizer is None:
            raise DuetError(f"{pair.target_dir}: no tokenizer.json; use --prompt-ids")
        ids = pair.tokenizer.encode(a.prompt)
    if not ids:
        raise DuetError("the prompt is empty")
    V = pair.target.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise DuetError(f"--prompt-ids: token {bad[0]} is outside the vocabulary [0, {V})")
    ctx = pair.target.config.max_context
    if len(ids) >= ctx:
        raise DuetError(
            f"the prompt is {len(ids)} tokens but the model's context is {ctx}; shorten it"
        )
    return ids


def generate(a: argparse.Namespace) -> dict:
    """Run one generation; returns {"tokens", "text", "stats"}."""
    check_args(a)
    alone = a.method == AUTO and a.target is not None and a.draft is None  # auto: ar then
    if needs_local_target(a):
        pair = load_pair_from_args(a, need_draft=a.method != "ar" and not alone)
    else:
        pair = load_draft_only(a)
    try:
        if a.method != "flexspec":
            return _generate(a, pair, {})
        with edge_options(a, pair.target_dir, pair.settings["target_backend"]) as edge:
            return _generate(a, pair, edge)
    finally:  # one run: a draft process mirror (or auto's probe) started ends with it
        from runtime.mirror.draft_process import close_draft_hosts

        close_draft_hosts(pair.draft)


def skip_stats(pair, events, rule, prompt: list[int], out: list[int], sampling) -> dict:
    """stats.skip: the skip rate and the rejection risk R measured by auditing the skipped
    tokens against the target when it is loaded here (runtime/edge/skip.py says how)."""
    from runtime.edge.skip import audit, skip_summary, skipped_positions

    pos, xs = skipped_positions(events, len(prompt), len(out))
    if pair.settings.get("target_backend") == "remote":
        return skip_summary(events, rule, len(out), None,
                            "no target loaded here (remote verifier without --target)")  # fmt: skip
    betas = audit(pair.target, prompt + out, pos, xs, sampling)
    return skip_summary(events, rule, len(out), betas)


def _generate(a: argparse.Namespace, pair, edge: dict) -> dict:
    ids = prompt_tokens(a, pair)
    emu = None
    if a.emulate:
        from devices.emulated_model import emulate_pair

        emu, pair.target, pair.draft = emulate_pair(a.emulate, pair.target, pair.draft)
    room = context_of(pair) - len(ids)
    if a.max_tokens > room:
        print(f"[--max-tokens {a.max_tokens} is past the context: cut to {room} (the model holds "
              f"{context_of(pair)} tokens, the prompt takes {len(ids)})]", file=sys.stderr)  # fmt: skip
    chooser = None
    if a.method == AUTO:
        chooser = auto_chooser(a, pair)
        if pair.draft is not None:
            print(auto_announcement(chooser, "first"), file=sys.stderr)
    timeline = Timeline() if a.method in ("mirror", AUTO) else None
    out: list[int] = []
    events = []
    stats = None
    responses = stream_generate(
        pair, ids, a.max_tokens, method=a.method, temp=a.temp, top_p=a.top_p, top_k=a.top_k,
        seed=a.seed, gamma=a.gamma, chooser=chooser, timeline=timeline, kappa=a.kappa,
        exit_layer=a.exit_layer, branches=a.branches, draft_branches=a.draft_branches,
        tree_k=a.tree_k, expand=a.expand, top_n=a.top_n, depth=a.depth, bins=a.bins,
        draft_process=a.draft_process, exit_head=a.exit_head, **edge,
    )  # fmt: skip
    for r in responses:
        out += r.tokens
        events.append(r.step)
        stats = r.stats
        if not a.json and pair.tokenizer is not None:
            sys.stdout.write(r.text)
            sys.stdout.flush()
    method = stats.extra["method"] if stats is not None else a.method
    if stats is None:  # no step ran (cannot happen with max_new >= 1; kept for safety)
        stats = RunStats(prefill_tokens=len(ids))
    if a.method == AUTO:
        a.gamma = stats.extra["auto"].get("gamma", a.gamma)  # without --gamma, auto picks γ too
        if a.trace and method != "mirror":
            print(f"no trace written: auto picked {method}, not mirror", file=sys.stderr)
    stats.extra.update(gamma=a.gamma if method != "ar" else None, **pair.settings)
    if method == "mirror":
        in_process = draft_in_process(pair.target, pair.draft, a.draft_process)
        stats.extra.update(draft_worker="process" if in_process else "thread", kappa=a.kappa,
                           exit_head=events[0].extra.get("exit_head") if events else None, exit_layer=events[0].extra.get("exit_layer") if events else None,
                           mirror=mirror_summary(events, timeline))  # fmt: skip
        if a.trace:
            timeline.write(a.trace, label="Duet Mirror-SD" + (f" ({emu.label})" if emu else ""))
    if edge:
        from runtime.edge.loop import edge_summary

        stats.extra.update(k=a.k, k_max=a.k_max, k_min=a.k_min, link=a.link, link_seed=a.link_seed,
                           server=a.server, edge=edge_summary(events),
                           lossy=edge.get("skip") is not None)  # fmt: skip
        if edge.get("skip") is not None:  # CU-HLM skipping: measured R (runtime/edge/skip.py)
            sampling = Sampling(a.temp, a.top_p, a.top_k)
            stats.extra["skip"] = skip_stats(pair, events, edge["skip"], ids, out, sampling)
    if emu is not None:
        stats.extra.update(emulated=emu.label, emulation=emu.summary())
    eos = set(eos_ids(pair))
    text = pair.tokenizer.decode([t for t in out if t not in eos]) if pair.tokenizer else None
    return {"tokens": out, "text": text, "stats": stats.as_dict()}


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    res = generate(a)
    if a.json:
        print(json.dumps(res))
    else:
        s = res["stats"]
        if res["text"] is None:
            print(" ".join(map(str, res["tokens"])))
        else:
            print(flush=True)
        rate = (
            f", acceptance {s['acceptance_rate']:.2f}" if s["acceptance_rate"] is not None else ""
        )
        tag = f"{s['method']}, {s['emulated']}" if "emulated" in s else s["method"]
        print(
            f"[{tag}] {s['new_tokens']} tokens in {s['wall_s']:.2f} s ({s['tokens_per_s']:.1f} tok/s), "
            f"mean accepted {s['mean_accepted']:.2f}{rate}",
            file=sys.stderr,
        )
        if s.get("target_backend_why"):
            print(f"[target on {s['target_backend']}: {s['target_backend_why']}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
