"""llama.cpp's `llama-server` as bench runners: `llama.cpp:ar` and its n-gram speculative types.

One server per mode (`-t`/`-tb` the bench's thread count, bound to 127.0.0.1, started once
for the whole run and stopped at its end; start-up is bounded by
apps/bench/runners/llamacpp_server.py's LlamaServer, each request by REQUEST_TIMEOUT_S). A turn
sends the prompt as token ids (the GGUF's vocabulary is the checkpoint's), so llama.cpp answers
the very prompt Duet answers,
and reads back the generated ids (`return_tokens`). Wall time is the HTTP round trip, prefill
included, as for every other runner; the server's own decode rate is kept in `settings()`.

Tokens per step: the server reports only totals per request (`timings.draft_n`,
`draft_n_accepted`); every target pass commits one token of its own plus the drafts it
accepted, so passes = tokens - accepted, and the turn's per-step lengths are those totals
spread evenly (their mean, the figure the rows print, is exact).

`--model-draft` (a GGUF draft model) is a mode only where such a GGUF exists; SmolLM2-135M
has none (no smaller model shares its vocabulary), which the row's note says.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from functools import lru_cache

from runtime.errors import DuetError

from .turn import TurnResult

REQUEST_TIMEOUT_S = 300  # one turn; a wedged server fails the run instead of hanging it
# n-gram modes and their settings: n 3 / m 8 is what issue 42 measured ngram-simple with;
# ngram-mod and ngram-cache keep llama.cpp's defaults
NGRAM_ARGS = {
    "ngram-simple": ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"],
    "ngram-map-k": ["--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "8"],
    "ngram-map-k4v": ["--spec-ngram-map-k4v-size-n", "3", "--spec-ngram-map-k4v-size-m", "8"],
    "ngram-mod": [],
    "ngram-cache": [],
}
NO_GGUF_DRAFT = (
    "no --gguf-draft given: no llama.cpp:draft row (--model-draft); SmolLM2-135M "
    "and Gemma 3 270M have no smaller GGUF sharing their vocabulary"
)


@lru_cache(maxsize=4)
def spec_types(binary: str) -> tuple[str, ...]:
    """The `--spec-type` values this build of llama-server lists in its --help."""
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DuetError(f"{binary} --help failed: {e}") from None
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("--spec-type"):
            return tuple(line.split()[1].split(","))
    return ()


def ngram_modes(binary: str) -> list[str]:
    """The n-gram speculative types this binary supports, in NGRAM_ARGS's order."""
    have = spec_types(binary)
    return [m for m in NGRAM_ARGS if m in have]


class LlamaCppRunner:
    """`llama.cpp:ar` (mode None), `llama.cpp:MODE` (an n-gram --spec-type) or `llama.cpp:draft`
    (mode "draft": `--model-draft draft_gguf`, γ draft tokens a step)."""

    group = "llama.cpp"

    def __init__(
        self,
        gguf: str,
        *,
        threads: int,
        mode: str | None,
        eos: tuple[int, ...],
        ctx: int = 4096,
        server_cls=None,
        draft_gguf: str | None = None,
        gamma: int = 4,
    ):
        from .llamacpp_server import LlamaServer

        self.mode = mode
        self.name = f"{self.group}:{mode or 'ar'}"
        self.own_ar = f"{self.group}:ar"
        self.gguf, self.threads, self.eos = gguf, threads, eos
        extra = [] if mode is None else ["--spec-type", mode, *NGRAM_ARGS.get(mode, [])]
        if mode == "draft":
            extra = ["--model-draft", str(draft_gguf), "--spec-draft-n-max", str(gamma)]
        self.extra = extra
        self.server = (server_cls or LlamaServer)(gguf, threads, ctx=ctx, extra=extra)
        self.server.__enter__()  # bounded start-up; close() stops it
        self.decode_rates: list[float] = []

    def settings(self) -> dict:
        rates = self.decode_rates
        return {
            "threads": self.threads,
            "gguf": self.gguf,
            "server_args": self.extra,
            "server_decode_tok_s": round(sum(rates) / len(rates), 2) if rates else None,
        }

    def close(self) -> None:
        self.server.__exit__(None, None, None)

    def request(self, body: dict) -> dict:
        req = urllib.request.Request(
            self.server.url + "/completion",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, TimeoutError) as e:
            raise DuetError(f"{self.name}: the request to llama-server failed: {e}") from None

    def generate(self, ids, max_new, temp, top_p, seed) -> TurnResult:
        body = {"prompt": list(ids), "n_predict": max_new, "cache_prompt": False,
                "return_tokens": True, "seed": seed, "temperature": temp, "min_p": 0.0,
                "top_k": 1 if temp == 0 else 0, "top_p": top_p, "repeat_penalty": 1.0}  # fmt: skip
        t0 = time.perf_counter()
        r = self.request(body)
        wall = time.perf_counter() - t0
        return turn_from_response(r, wall, self.eos, self.decode_rates)


def turn_from_response(r: dict, wall: float, eos: tuple[int, ...], rates=None) -> TurnResult:
    """A TurnResult from one /completion response (tokens, timings and draft totals)."""
    toks = [int(t) for t in r.get("tokens") or []]
    if r.get("stop_type") == "eos" and eos and (not toks or toks[-1] not in eos):
        toks.append(eos[0])  # the server drops the EOS it stopped at; Duet's runners count it
    t = r.get("timings") or {}
    if rates is not None and t.get("predicted_per_second"):
        rates.append(float(t["predicted_per_second"]))
    accepted = int(t.get("draft_n_accepted") or 0)
    return TurnResult(
        toks,
        wall,
        even_lengths(len(toks), len(toks) - accepted),
        note=None if "draft_n" in t or not accepted else "no draft stats",
    )


def even_lengths(tokens: int, steps: int) -> list[int]:
    """`steps` per-step lengths summing to `tokens`, as even as integers allow (the peers report
    only totals: the mean is exact, the spread is not observed)."""
    if tokens <= 0:
        return []
    steps = max(1, min(steps, tokens))
    q, rem = divmod(tokens, steps)
    return [q + 1] * rem + [q] * (steps - rem)
