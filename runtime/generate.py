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
import types

from runtime.api import context_of, eos_ids, prompt_ids
from runtime.cli_args import (
    AUTO,
    add_auto_args,
    add_method_args,
    add_pair_args,
    auto_announcement,
    auto_chooser,
    auto_options,
    check_decoding_args,
    check_method_args,
    load_pair_from_args,
    method_kwargs,
)
from runtime.cli_parser import doc_parser
from runtime.decoding import METHODS, Sampling, method_module
from runtime.edge.cli_args import (
    add_edge_args,
    check_edge_method,
    edge_session,
    load_draft_only,
    needs_local_target,
)
from runtime.errors import DuetError, cli_main
from runtime.preflight import writable_file
from runtime.session import GenerationSession
from runtime.stats import RunStats


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m runtime.generate", __doc__)
    add_pair_args(ap)
    ap.add_argument(
        "--method",
        choices=(*METHODS, AUTO),
        default=AUTO,
        help="decoding method (default auto: the one the latency model predicts "
        "fastest for this pair on this machine, γ too when --gamma is not given; "
        "its first run measures the pair, some seconds, and keeps the figures for "
        "later runs: see --reprobe)",
    )
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
    add_method_args(ap)
    add_edge_args(ap)
    ap.add_argument(
        "--trace",
        metavar="FILE",
        help="mirror: write a Chrome trace (open in Perfetto) of what target, draft "
        "and channel did",
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
    check_method_args(a)
    check_edge_method(a)
    if a.trace and a.method != AUTO and not records_timeline(a.method):
        raise DuetError("--trace records the Mirror-SD timeline; use it with --method mirror")
    if a.trace:
        writable_file(a.trace, "--trace")
    if a.prompt_ids is not None:
        parse_ids(a.prompt_ids)
    if a.emulate:
        from devices.emulation import split_spec
        from devices.profile import load_profile

        load_profile(split_spec(a.emulate)[0])  # as Emulator.from_spec reads it


def records_timeline(method: str) -> bool:
    return getattr(method_module(method), "RECORDS_TIMELINE", False)


def generate(a: argparse.Namespace) -> dict:
    """Run one generation; returns {"tokens", "text", "stats"}."""
    check_args(a)
    alone = a.method == AUTO and a.target is not None and a.draft is None  # auto: ar then
    if needs_local_target(a):
        pair = load_pair_from_args(a, need_draft=a.method != "ar" and not alone)
    else:
        pair = load_draft_only(a)
    try:
        with edge_session(a, pair) as (edge, edge_settings):
            res = _generate(a, pair, edge)
            res["stats"].update(edge_settings)
            return res
    finally:  # one run: a draft process mirror (or auto's probe) started ends with it
        from runtime.mirror.draft_process import close_draft_hosts

        close_draft_hosts(pair.draft)


def _generate(a: argparse.Namespace, pair, edge: dict) -> dict:
    """parse -> options -> session -> print: the run, its text streamed unless --json."""
    ids = prompt_ids(pair, parse_ids(a.prompt_ids) if a.prompt_ids is not None else a.prompt)
    emu = None
    if a.emulate:
        from devices.emulated_model import emulate_pair

        emu, pair.target, pair.draft = emulate_pair(a.emulate, pair.target, pair.draft)
    room = context_of(pair) - len(ids)
    if a.max_tokens > room:
        print(
            f"[--max-tokens {a.max_tokens} is past the context: cut to {room} (the model holds "
            f"{context_of(pair)} tokens, the prompt takes {len(ids)})]",
            file=sys.stderr,
        )
    chooser = None
    if a.method == AUTO:
        chooser = auto_chooser(auto_options(a), pair)
        if pair.draft is not None:
            print(auto_announcement(chooser, "first"), file=sys.stderr)
    session = GenerationSession(
        pair,
        method=a.method,
        options={**method_kwargs(a), **edge},
        chooser=chooser,
        eos=eos_ids(pair),
    )
    out: list[int] = []
    stats = RunStats(prefill_tokens=len(ids))  # until a step reports (max_new >= 1: it will)
    sampling = Sampling(a.temp, a.top_p, a.top_k)
    for r in session.stream(ids, a.max_tokens, sampling=sampling, seed=a.seed):
        out += r.tokens
        stats = r.stats
        if not a.json and pair.tokenizer is not None:
            sys.stdout.write(r.text)
            sys.stdout.flush()
    method = stats.extra.get("method", a.method)
    stats.extra.update(pair.settings)
    if a.trace and session.timeline is None:
        print(f"no trace written: auto picked {method}, not mirror", file=sys.stderr)
    elif a.trace:
        label = "Duet Mirror-SD" + (f" ({emu.label})" if emu else "")
        session.timeline.write(a.trace, label=label)
    if emu is not None:
        stats.extra.update(emulated=emu.label, emulation=emu.summary())
    eos = set(session.eos)
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
            f"[{tag}] {s['new_tokens']} tokens in {s['wall_s']:.2f} s "
            f"({s['tokens_per_s']:.1f} tok/s), "
            f"mean accepted {s['mean_accepted']:.2f}{rate}",
            file=sys.stderr,
        )
    return 0


class _CallableModule(types.ModuleType):
    """`import runtime.generate` binds this module as `runtime.generate`, where the Python API's
    `from runtime import generate` means the function (runtime/api.py): calling the module calls
    the function, so the name works in either order."""

    def __call__(self, *args, **kwargs):
        from runtime.api import generate as api_generate

        return api_generate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
