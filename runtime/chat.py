"""`python -m runtime.chat`: talk to a target/draft pair, one answer per line you type.

    python -m runtime.chat                       # the embedded default pair, `--method auto`
    python -m runtime.chat --target DIR --draft DIR --method ar --temp 0.7
    printf 'def fib(n):\\n' | python -m runtime.chat --max-tokens 64

Tokens are printed as they are committed, and each answer ends with one stats
line on stderr (its `prefill N new tokens`: what the turn's prompt added). The KV caches live
across turns, and earlier answers stay the ids that were generated, so a turn only prefills
its new message and the template's tokens around it. The tokenizer's chat template is used
when the checkpoint has one; otherwise each line continues the text so far (plain completion).
The method defaults to auto: the latency model's pick per answer (sd, mirror or ar), from
the pair measured on this machine during the first answer of its first chat and kept for
later chats (devices/probe_store.py; --reprobe measures again); /stats says what it picked
and why.
Commands: /help, /reset (forget the conversation), /stats, /quit. Ctrl-C stops the
current answer; at the prompt, Ctrl-C or EOF (Ctrl-D) ends the session.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import sys

from runtime.api import DEFAULT_CHAT_TEMP, DEFAULT_CHAT_TOP_P, eos_ids, sampling_defaults
from runtime.chat_session import ChatSession, stats_line
from runtime.chat_template import ChatTemplate
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
from runtime.decoding import METHODS, Sampling
from runtime.edge.cli_args import add_edge_args, check_edge_method, edge_session
from runtime.errors import DuetError, cli_main
from runtime.tokenizer import Detokenizer

HELP = """commands:
  /help    this text
  /reset   forget the conversation (fresh KV caches)
  /stats   the last answer's figures (and, with --method auto, what it picked and why)
  /quit    end the session (also Ctrl-D, or Ctrl-C at the prompt)
Ctrl-C while an answer streams stops that answer."""


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m runtime.chat", __doc__)
    add_pair_args(ap)
    ap.add_argument(
        "--method",
        choices=(*METHODS, AUTO),
        default=AUTO,
        help="decoding method; auto (the default): the one the latency model "
        "predicts fastest here, chosen per answer; the pair is measured on this "
        "machine during the first chat's first answer and kept for later chats "
        "(see --reprobe)",
    )
    add_auto_args(ap)
    ap.add_argument(
        "--temp",
        type=float,
        default=None,
        help="temperature; 0 = greedy (default: the checkpoint's generation_config.json "
        f"when it sets temperature and top_p, else {DEFAULT_CHAT_TEMP}; the answer "
        "keeps the target's own law at any temperature)",
    )
    ap.add_argument(
        "--top-p",
        type=float,
        default=None,
        help=f"nucleus mass (default: generation_config.json's, else {DEFAULT_CHAT_TOP_P})",
    )
    ap.add_argument(
        "--max-tokens", type=int, default=256, help="new tokens per answer at most (default 256)"
    )
    ap.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    ap.add_argument("--system", default=None, help="system message (chat templates only)")
    add_method_args(ap)
    add_edge_args(ap)
    return ap


def check_args(a: argparse.Namespace) -> None:
    """Checks before the load; --temp / --top-p not given are checked at their fallbacks (the
    checkpoint's generation_config.json is read once the pair is found: resolve_sampling)."""
    given = a.temp, a.top_p
    a.temp = DEFAULT_CHAT_TEMP if a.temp is None else a.temp
    a.top_p = DEFAULT_CHAT_TOP_P if a.top_p is None else a.top_p
    check_decoding_args(a)
    check_method_args(a)
    check_edge_method(a)
    a.temp, a.top_p = given


def resolve_sampling(a: argparse.Namespace, model_dir) -> None:
    """--temp / --top-p not given: generation_config.json's when it sets both, else 0.7 / 0.9."""
    temp, top_p = sampling_defaults(model_dir)
    a.temp = temp if a.temp is None else a.temp
    a.top_p = top_p if a.top_p is None else a.top_p
    check_edge_method(a)  # flexspec: its codec's default follows the temperature


def make_session(a: argparse.Namespace, notify) -> ChatSession:
    alone = a.method == AUTO and a.target is not None and a.draft is None  # auto: ar then
    pair = load_pair_from_args(a, need_draft=a.method != "ar" and not alone)
    if pair.tokenizer is None:
        raise DuetError(f"{pair.target_dir}: no tokenizer.json; the chat needs a tokenizer")
    resolve_sampling(a, pair.target_dir)
    stack = contextlib.ExitStack()  # flexspec: the verifier connection lives as long as the chat
    edge, _ = stack.enter_context(edge_session(a, pair))
    atexit.register(stack.close)
    return ChatSession(
        pair.target,
        pair.draft,
        pair.tokenizer,
        method=a.method,
        gamma=a.gamma,
        sampling=Sampling(a.temp, a.top_p),
        max_tokens=a.max_tokens,
        seed=a.seed,
        template=ChatTemplate.load(pair.target_dir),
        system=a.system,
        notify=notify,
        eos=eos_ids(pair),
        **{k: v for k, v in method_kwargs(a).items() if k != "gamma"},
        **edge,
        chooser=auto_chooser(auto_options(a), pair) if a.method == AUTO else None,
    )


def read_line(interactive: bool) -> str | None:
    """The next line typed, or None at EOF."""
    if interactive:
        try:
            return input(">>> ")
        except EOFError:
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


def answer(session: ChatSession, text: str, out) -> None:
    """Stream one answer to `out`; Ctrl-C stops it and returns to the prompt."""
    detok = Detokenizer(session.tok)
    gen = session.answer(text)
    try:
        for toks in gen:
            out.write(detok.add([t for t in toks if t not in session.eos]))
            out.flush()
    except KeyboardInterrupt:
        out.write(" [stopped]")
    finally:
        gen.close()  # the strategy rewinds its caches; the session keeps what was committed
    out.write("\n")
    out.flush()
    if session.last_stats is not None:
        s = session.last_stats
        lossy = " LOSSY (--skip: see /stats)" if s.extra.get("lossy") else ""
        print(
            stats_line(s.extra.get("method", session.method), s) + lossy,
            file=sys.stderr,
            flush=True,
        )


def plain_summary(stats) -> str:
    """/stats' first line, in words: what ran and what it gained."""
    s = stats.as_dict()
    method, rate = s.get("method", "?"), s["tokens_per_s"]
    if method == "ar" or not s["steps"]:
        return (
            f"the target alone (no speculation): {s['new_tokens']} tokens at "
            f"{rate:.1f} tokens per second."
        )
    ahead = f", {s['gamma']} tokens ahead" if s.get("gamma") else ""
    said = (
        f"speculating with {method}{ahead}: {s['mean_accepted']:.1f} tokens per step, "
        f"{rate:.1f} tokens per second"
    )
    ar = ((s.get("auto") or {}).get("predictions") or {}).get("ar")
    if ar and ar.get("tokens_per_s"):  # auto's prediction of the target alone on this machine
        said += f", {rate / ar['tokens_per_s']:.1f}x faster than the target alone"
    return said + "."


def stats_text(session: ChatSession) -> str:
    """/stats: the last answer's figures, and auto's choice with every prediction."""
    s = session.last_stats
    if s is None:
        return "[no answer yet]"
    lines = [plain_summary(s), "details: " + stats_line(s.extra.get("method", session.method), s)]
    sp = getattr(session, "splice", None)  # a template: what the prompt kept of the conversation
    if sp is not None:
        lines.append(
            f"prompt: {len(sp.ids)} tokens, {sp.kept} kept as the caches held them ({sp.how}), "
            f"{s.prefill_tokens} prefilled"
        )
    sk = s.extra.get("skip")
    if sk:
        lines.append(
            f"LOSSY (--skip): {sk['skipped']} of {sk['output_tokens']} tokens committed "
            f"unverified (u_th {sk['u_th']:.3f}); measured risk R {sk['measured_risk']:.4f}, "
            f"Theorem 1 bound {sk.get('theorem1_bound', float('nan')):.4f}"
        )
    auto = s.extra.get("auto")
    if auto:
        lines.append(f"auto picked {auto['choice']}: {auto['why']}")
        for m, p in auto.get("predictions", {}).items():
            lines.append(
                f"  {m:<7} predicted {p['tokens_per_s']:.1f} tok/s, "
                f"step {p['step_ms']:.2f} ms, {p['tokens_per_step']:.2f} tokens/step"
            )
        if auto.get("factors"):  # measured / predicted, from trial and earlier chosen runs
            lines.append(
                "  laws scaled by what runs measured: "
                + ", ".join(f"{m} x{f:.2f}" for m, f in auto["factors"].items())
            )
        for m, t in auto.get("trials", {}).items():
            lines.append(f"  trial run {m}@g{t['gamma']}: {t['tokens_per_s']:.1f} tok/s")
        if "inputs" in auto:
            lines.append(f"  stage times {auto['inputs']['source']}")
    return "\n".join(lines)


def repl(session: ChatSession, interactive: bool) -> int:
    """Read lines until EOF or /quit; returns the exit code."""
    if session.template is None:  # said once, interactive or piped
        print(
            "[this model has no chat template: each line you type is continued as plain "
            "text, with no newline added after it]",
            file=sys.stderr,
            flush=True,
        )
    if interactive:
        s = session.sampling
        how = "greedy" if s.greedy else f"sampling at temperature {s.temp:g}, top-p {s.top_p:g}"
        print(f"Duet chat ({session.method}, {how}). /help for commands.", file=sys.stderr)
    while True:
        try:
            line = read_line(interactive)
        except KeyboardInterrupt:  # Ctrl-C at the prompt ends the session
            print(file=sys.stderr)
            return 0
        if line is None:
            if interactive:
                print(file=sys.stderr)
            return 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            cmd = text.split()[0].lower()
            if cmd in ("/quit", "/exit"):
                return 0
            if cmd == "/help":
                print(HELP, flush=True)
            elif cmd == "/stats":
                print(stats_text(session), flush=True)
            elif cmd == "/reset":
                session.reset()
                print("[conversation reset]", file=sys.stderr, flush=True)
            else:
                print(f"unknown command {cmd}; /help lists them", file=sys.stderr, flush=True)
            continue
        answer(session, line, sys.stdout)


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    check_args(a)
    session = make_session(a, notify=lambda m: print(m, file=sys.stderr, flush=True))
    if session.chooser is not None:  # its probe runs inside the first answer: say so first
        print(
            auto_announcement(session.chooser, "during the first answer"),
            file=sys.stderr,
            flush=True,
        )
    return repl(session, interactive=sys.stdin.isatty())


if __name__ == "__main__":
    sys.exit(main())
