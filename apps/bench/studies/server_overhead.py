"""`python -m apps.bench.studies.server_overhead`: what serving over HTTP costs against
runtime.generate.

Starts `python -m apps.server` (same pair, method and flags) on a free port, loads
the same pair in this process, and alternates, round by round, the same greedy
generation both ways (which goes first alternates too):
  - in process, the loop runtime.generate runs (make_steps + stream; tokens/s as its
    `stats.tokens_per_s`, from the first step to the last token);
  - through the server, one streaming client (stdlib http.client, server-sent events):
    tokens/s = completion tokens / (request sent -> `[DONE]`), and time to first token
    = request sent -> first chunk with text.
Each round's prompt is a different 32-token window of one text (by token ids), so
the server's prefix cache cannot help. It reports medians, the ratio, and whether
both ways produced the same tokens. Timings are wall-clock on whatever else runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from runtime.cli_args import add_pair_args, load_pair_from_args
from runtime.cli_parser import doc_parser
from runtime.decoding import METHODS, Sampling, make_steps, stream
from runtime.errors import DuetError, cli_main
from runtime.stats import RunStats

TEXT = Path(__file__).with_name("server_overhead.py")  # any long text will do: this file


def start_server(a: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "apps.server", "--port", "0", "--method", a.method,
           "--gamma", str(a.gamma), "--draft-threads", str(a.draft_threads)]  # fmt: skip
    for flag in ("target", "draft", "target_backend", "draft_backend", "target_threads"):
        v = getattr(a, flag)
        if v is not None:
            cmd += ["--" + flag.replace("_", "-"), str(v)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise DuetError(f"the server did not start (first line {line!r})")
    return proc, int(line.rsplit(":", 1)[1])


def local_run(pair, ids: list[int], a) -> dict:
    """runtime.generate's loop in this process."""
    stats = RunStats(prefill_tokens=len(ids))
    steps = make_steps(
        a.method,
        pair.target,
        pair.draft,
        ids,
        max_new=a.max_tokens,
        sampling=Sampling(0.0),
        seed=0,
        gamma=a.gamma,
    )
    out, t0, ttft = [], time.perf_counter(), None
    for toks, _ in stream(
        steps, max_new=a.max_tokens, eos_ids=pair.target.config.eos_token_ids, stats=stats
    ):
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        out += toks
    s = stats.as_dict()
    return {"tokens": out, "tokens_per_s": s["tokens_per_s"], "ttft_s": ttft}


def server_run(port: int, ids: list[int], a) -> dict:
    """One streaming request; times measured at the client."""
    body = json.dumps(
        {
            "prompt": ids,
            "max_tokens": a.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise DuetError(f"server answered {resp.status}: {resp.read()[:200]!r}")
    ttft, tokens, usage = None, [], {}
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        ev = json.loads(line[6:])
        for c in ev["choices"]:
            if c.get("text") and ttft is None:
                ttft = time.perf_counter() - t0
            tokens = c.get("token_ids", tokens)
        usage = ev.get("usage") or usage
    wall = time.perf_counter() - t0
    conn.close()
    n = usage["completion_tokens"]
    return {
        "tokens": tokens,
        "tokens_per_s": n / wall,
        "ttft_s": ttft,
        "engine_tokens_per_s": usage["speculative"]["tokens_per_s"],
    }


def measure(a: argparse.Namespace) -> dict:
    pair = load_pair_from_args(a, need_draft=a.method != "ar")
    if pair.tokenizer is None:
        raise DuetError(f"{pair.target_dir}: no tokenizer.json")
    all_ids = pair.tokenizer.encode(TEXT.read_text())
    proc, port = start_server(a)
    rows = []
    try:
        server_run(port, all_ids[-a.prompt_len :], a)  # warm-up, both ways, untimed
        local_run(pair, all_ids[-a.prompt_len :], a)
        for r in range(a.rounds):
            ids = all_ids[r * 7 : r * 7 + a.prompt_len]
            if r % 2:  # alternate which goes first, so neither always finds the caches warm
                srv, loc = server_run(port, ids, a), local_run(pair, ids, a)
            else:
                loc, srv = local_run(pair, ids, a), server_run(port, ids, a)
            rows.append(
                {"local": loc, "server": srv, "same_tokens": loc["tokens"] == srv["tokens"]}
            )
    finally:
        proc.terminate()
        proc.wait(10)

    def med(side, key):
        return statistics.median(r[side][key] for r in rows)

    res = {
        "method": a.method, "rounds": a.rounds, "prompt_tokens": a.prompt_len,
        "max_tokens": a.max_tokens,
        "generate_tokens_per_s": med("local", "tokens_per_s"),
        "server_tokens_per_s": med("server", "tokens_per_s"),
        "server_engine_tokens_per_s": med("server", "engine_tokens_per_s"),
        "server_ttft_s": med("server", "ttft_s"),
        "generate_ttft_s": med("local", "ttft_s"),
        "same_tokens": all(r["same_tokens"] for r in rows),
        **pair.settings,
    }  # fmt: skip
    res["ratio"] = res["server_tokens_per_s"] / res["generate_tokens_per_s"]
    return res


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = doc_parser("python -m apps.bench.studies.server_overhead", __doc__)
    add_pair_args(ap)
    ap.add_argument("--method", choices=METHODS, default="sd")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for flag, v in (
        ("--max-tokens", a.max_tokens),
        ("--prompt-len", a.prompt_len),
        ("--rounds", a.rounds),
        ("--gamma", a.gamma),
    ):
        if v < 1:
            raise DuetError(f"{flag} must be at least 1 (got {v})")
    r = measure(a)
    if a.json:
        print(json.dumps(r))
    else:
        print(
            f"[{r['method']}] {r['rounds']} rounds, {r['prompt_tokens']}-token prompts, "
            f"{r['max_tokens']} new tokens, medians; same tokens both ways: {r['same_tokens']}"
        )
        print(
            f"  runtime.generate loop  {r['generate_tokens_per_s']:7.1f} tok/s   "
            f"first token {r['generate_ttft_s'] * 1e3:6.1f} ms"
        )
        print(
            f"  server, streaming      {r['server_tokens_per_s']:7.1f} tok/s   "
            f"first token {r['server_ttft_s'] * 1e3:6.1f} ms   (engine inside: "
            f"{r['server_engine_tokens_per_s']:.1f} tok/s)"
        )
        print(f"  server / generate      {r['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
