"""`python -m apps.bench turns`: a multi-turn chat and the first token, Duet against llama.cpp.

    python -m apps.bench turns --target smollm2-135m-instruct --turns 10 --threads 2
    python -m apps.bench turns --target model.gguf --temp 0 --no-peers --json

Two measurements on the same model (a GGUF, or a checkpoint described from one), same threads:
- A chat of `--turns` fixed user messages (TURNS), each answered with up to `--max-tokens`
  tokens, sampled at the chat's own default (the checkpoint's generation config) unless `--temp`
  is given. Duet runs `runtime.chat`'s own session (its default flags: the plain command);
  llama.cpp runs `llama-server` with its prompt cache (`cache_prompt`) on the same
  conversation, through its chat endpoint and the GGUF's template. Per turn: the tokens each
  prefilled, the turn's new tokens (the new message and what the template adds around it:
  the rendering with it minus the rendering of the history before it), and the turn's seconds.
  Duet's goal (issue 57): turns 2.. prefill at most 1.1x their new tokens.
- Time to the first token from a cold start with a cached model: `python -m runtime.generate
  --target X --prompt P --max-tokens 1` from spawn to its first byte of text on stdout, against
  `llama-server` from spawn to its health check plus a one-token completion, median of
  `--repeats`. The first Duet run (unmeasured) fills the cache, so every measured run loads it.

The answers differ (two engines sample differently); the prefill counts and times are what is
compared.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main

TURNS = (
    "Hi! Can you help me plan a short trip?",
    "I like museums and quiet cafes. Which city would you suggest?",
    "How many days should I stay there?",
    "What should I pack for that time of year?",
    "Suggest a plan for the first day.",
    "And the second day?",
    "Which neighbourhood is good to stay in?",
    "How do I get around the city cheaply?",
    "Any food I should try?",
    "Thanks! Summarize the whole plan in three lines.",
)
PROMPT = "Explain speculative decoding in one sentence."


def build_parser():
    ap = doc_parser("python -m apps.bench turns", __doc__)
    ap.add_argument("--target", required=True, help="a short name, a .gguf, or a checkpoint dir")
    ap.add_argument("--turns", type=int, default=10, help=f"1..{len(TURNS)} (default 10)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default 64)")
    ap.add_argument("--temp", type=float, default=None, help="default: the chat's own")
    ap.add_argument("--threads", type=int, default=2, help="everyone's threads (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="cold starts each (default 3)")
    ap.add_argument("--no-peers", action="store_true", help="Duet alone (no llama-server)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return ap


def gguf_of(target: str) -> Path | None:
    """The GGUF file behind `target` (itself, or the one its checkpoint was described from)."""
    from runtime.gguf_import import gguf_source
    from runtime.loading import resolve

    if target.endswith(".gguf"):
        return Path(target).expanduser()
    return gguf_source(resolve(target, "target"))


def duet_chat(a) -> list[dict]:
    """Duet's turns through runtime.chat's own session, with the chat's default flags."""
    from runtime.chat import build_parser as chat_parser
    from runtime.chat import make_session

    argv = ["--target", a.target, "--max-tokens", str(a.max_tokens)]
    argv += ["--target-threads", str(a.threads)] + (
        ["--temp", str(a.temp)] if a.temp is not None else []
    )
    session = make_session(
        chat_parser().parse_args(argv), notify=lambda m: print(m, file=sys.stderr)
    )
    rows, history, answered = [], [], 0
    for user in TURNS[: a.turns]:
        t0 = time.perf_counter()
        out = [t for toks in session.answer(user) for t in toks]
        secs = time.perf_counter() - t0
        s = session.last_stats
        new = new_tokens(session.template, history, user, answered) if session.template else None
        answered = len(out)
        answer = session.tok.decode([t for t in out if t not in session.eos])
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        rows.append(
            {
                "prefill": s.prefill_tokens,
                "new": new,
                "tokens": len(out),
                "s": secs,
                "method": s.extra.get("method"),
            }
        )
    return rows


def new_tokens(template, history: list[dict], user: str, answered: int) -> int:
    """The tokens a turn adds: the rendering with the new message (and the generation prompt)
    minus the previous turn's prompt (the history before its answer, with the generation
    prompt) and minus that answer's `answered` generated tokens: the new message, and what the
    template adds around it and after the previous answer."""
    with_new = template.render(history + [{"role": "user", "content": user}])
    if not history:
        return len(with_new)
    return len(with_new) - len(template.render(history[:-1])) - answered


def llama_chat(a, gguf: Path) -> list[dict]:
    """llama-server's turns on the same conversation, its prompt cache on."""
    from apps.bench.runners.llamacpp_server import LlamaServer, _post

    rows, history = [], []
    with LlamaServer(str(gguf), a.threads, ctx=4096) as srv:
        for user in TURNS[: a.turns]:
            history.append({"role": "user", "content": user})
            body = {
                "messages": history,
                "max_tokens": a.max_tokens,
                "cache_prompt": True,
                "seed": 0,
                **({"temperature": a.temp} if a.temp is not None else {}),
            }
            t0 = time.perf_counter()
            r = _post(srv.url + "/v1/chat/completions", body)
            secs = time.perf_counter() - t0
            answer = r["choices"][0]["message"]["content"]
            history.append({"role": "assistant", "content": answer})
            t = r.get("timings", {})
            rows.append({"prefill": t.get("prompt_n"), "tokens": t.get("predicted_n"), "s": secs})
    return rows


def duet_first_token(a) -> float:
    """Seconds from spawning `runtime.generate` to its first byte of text on stdout."""
    cmd = [
        sys.executable,
        "-m",
        "runtime.generate",
        "--target",
        a.target,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "1",
        "--target-threads",
        str(a.threads),
    ]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    first = p.stdout.read(1)
    secs = time.perf_counter() - t0
    p.communicate(timeout=600)
    if not first or p.returncode:
        raise DuetError(f"runtime.generate on {a.target} failed (exit {p.returncode})")
    return secs


def llama_first_token(a, gguf: Path) -> float:
    """Seconds from spawning llama-server to a one-token completion (health polled every 20 ms)."""
    from apps.bench.runners.llamacpp_server import LlamaServer, _post

    t0 = time.perf_counter()
    srv = LlamaServer(str(gguf), a.threads)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(srv.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.02)
        _post(srv.url + "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0})
        return time.perf_counter() - t0
    finally:
        srv.__exit__(None, None, None)


def measure(a) -> dict:
    gguf = gguf_of(a.target)
    peers = not a.no_peers
    if peers and (gguf is None or not gguf.is_file()):
        raise DuetError(f"{a.target}: no GGUF file behind it for llama.cpp; pass --no-peers")
    out = {"duet_turns": duet_chat(a)}
    duet_first_token(a)  # unmeasured: the cache is filled
    out["duet_first_token_s"] = [duet_first_token(a) for _ in range(a.repeats)]
    if peers:
        out["llama_turns"] = llama_chat(a, gguf)
        out["llama_first_token_s"] = [llama_first_token(a, gguf) for _ in range(a.repeats)]
    later = [r for r in out["duet_turns"][1:] if r["new"]]
    if later:
        out["prefill_over_new"] = max(r["prefill"] / r["new"] for r in later)
    return out


def table(res: dict) -> str:
    lines = ["turn  duet prefill  new  duet s   llama prefill  llama s"]
    lt = res.get("llama_turns", [])
    for i, r in enumerate(res["duet_turns"]):
        p = lt[i] if i < len(lt) else {}
        lines.append(
            f"{i + 1:4d}  {r['prefill']:12d}  {r['new'] or 0:3d}  {r['s']:6.2f}   "
            f"{p.get('prefill') or 0:13d}  {p.get('s', 0):7.2f}"
        )
    d = statistics.median(res["duet_first_token_s"])
    ft = f"first token, cold start, cached model: Duet {d:.2f} s"
    if "llama_first_token_s" in res:
        ll = statistics.median(res["llama_first_token_s"])
        ft += f", llama.cpp {ll:.2f} s ({d / ll:.2f}x)"
    if "prefill_over_new" in res:
        lines.append(f"turns 2..: prefill at most {res['prefill_over_new']:.2f}x the new tokens")
    return "\n".join(lines + [ft])


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if not 1 <= a.turns <= len(TURNS):
        raise DuetError(f"--turns must be in 1..{len(TURNS)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = measure(a) | {"settings": vars(a)}
    print(json.dumps(res) if a.json else table(res))
    return 0
