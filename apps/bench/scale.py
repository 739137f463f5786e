"""`python -m apps.bench scale`: Duet at the sizes users run, against llama.cpp on the same
file. Every figure here comes from a GGUF of a real model's exact shape with RANDOM weights
(`python -m apps.models synth`, written into the cache when missing): load costs, memory, disk
and speed are real; what a model would say is not, so no acceptance is measured here (take
tokens per step from the real models).

    python -m apps.bench scale --shapes smollm2-360m,smollm2-1.7b --threads 2
    python -m apps.bench scale --shapes llama-3.1-8b --quant Q4_0 --no-peers

Per shape, each in a fresh process (its peak RSS its own: os.wait4's ru_maxrss):
- Duet's first load: `runtime.generate --target-backend onnx --method ar` over an empty cache
  (the GGUF described, its ONNX target built from its blocks, the session, the turn); then
  the cached load, the same command again. Wall time, peak RSS over the file's size, the cache
  on disk over the file's size, and the turn's tokens/s (prefill included).
- The verify-pass cost at 1, 2, 3, 5, 8 and 9 tokens over 200 cached ones
  (converters/onnx_target_bench.pass_costs), each over the 1-token pass.
- llama.cpp's `llama-server` on the same file and threads: seconds to its health check, its
  peak RSS (VmHWM) after the same greedy turn, and its decode tokens/s.
- KV bytes per token: Duet's float32 KV (the ONNX target's), llama.cpp's float16.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
WINDOWS = (1, 2, 3, 5, 8, 9)


def build_parser():
    from apps.models.shapes import SHAPES

    ap = doc_parser("python -m apps.bench scale", __doc__)
    ap.add_argument(
        "--shapes",
        default="smollm2-360m,smollm2-1.7b",
        help=f"comma-separated, from: {', '.join(SHAPES)}",
    )
    ap.add_argument("--quant", default="Q4_0", help="the synth GGUF's quant mix (default Q4_0)")
    ap.add_argument("--threads", type=int, default=2, help="for Duet and llama.cpp alike")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens in the timed turn")
    ap.add_argument("--no-peers", action="store_true", help="skip llama.cpp")
    ap.add_argument("--no-pass-cost", action="store_true", help="skip the verify-pass costs")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    return ap


def child(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> dict:
    """Run `cmd` to its end: {wall_s, peak_bytes (its own ru_maxrss, from os.wait4), stdout};
    killed past `timeout`; a failure is one DuetError line."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)  # reaped here, so the rusage is this child's
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        text, errs = out.read(), err.read()
    if p.returncode:
        last = (errs.strip().splitlines() or ["(no message)"])[-1]
        raise DuetError(f"`{' '.join(cmd[2:5])} ...` failed (exit {p.returncode}): {last}")
    return {"wall_s": wall, "peak_bytes": usage.ru_maxrss * 1024, "stdout": text}


def tree_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.exists() else 0


def duet_loads(gguf: Path, work: Path, threads: int, max_tokens: int) -> dict:
    """First and cached load of the plain ONNX-target command, each in a fresh process."""
    models = work / "models"
    shutil.rmtree(models, ignore_errors=True)
    env = {**os.environ, "DUET_MODELS_DIR": str(models)}
    cmd = [sys.executable, "-m", "runtime.generate", "--target", str(gguf),
           "--target-backend", "onnx", "--quantize", "int4", "--method", "ar",
           "--target-threads", str(threads), "--prompt", PROMPT,
           "--max-tokens", str(max_tokens), "--json"]  # fmt: skip
    first, cached = child(cmd, env), child(cmd, env)
    stats = json.loads(cached["stdout"])["stats"]  # the turn: prefill and decode, no load
    return {
        "first_load_s": first["wall_s"],
        "first_peak_bytes": first["peak_bytes"],
        "cached_s": cached["wall_s"],
        "cached_peak_bytes": cached["peak_bytes"],
        "disk_bytes": tree_bytes(models),
        "tokens_per_s": stats.get("tokens_per_s"),
        "env": env,
    }


def pass_cost(gguf: Path, env: dict, threads: int) -> dict:
    cmd = [sys.executable, "-m", "converters.onnx_target_cli", "pass-cost", "--model", str(gguf),
           "--windows", ",".join(map(str, WINDOWS)), "--repeats", "10",
           "--threads", str(threads), "--json"]  # fmt: skip
    r = json.loads(child(cmd, env)["stdout"])
    return {"seconds": r["seconds"], "ratio": r["ratio"]}


def llamacpp(gguf: Path, threads: int, max_tokens: int) -> dict:
    from apps.bench.runners.llamacpp_server import LlamaServer

    t0 = time.perf_counter()
    with LlamaServer(str(gguf), threads) as srv:
        start = time.perf_counter() - t0
        srv.complete(PROMPT, 8)  # warm-up
        r = srv.complete(PROMPT, max_tokens)
        status = Path(f"/proc/{srv.proc.pid}/status")
        hwm = next((ln for ln in status.read_text().splitlines() if ln.startswith("VmHWM")), "")
    return {
        "start_s": start,
        "peak_bytes": int(hwm.split()[1]) * 1024 if hwm else None,
        "tokens_per_s": r["tok_s"],
    }


def measure(name: str, a) -> dict:
    from apps.models.shapes import shape
    from apps.models.synth import synth
    from runtime import paths

    s = shape(name)
    work = paths.cache_dir("scale") / f"{name}-{a.quant}"
    work.mkdir(parents=True, exist_ok=True)
    gguf = work / f"{name}-{a.quant}.gguf"
    if not gguf.is_file():
        print(f"[scale] writing {gguf} (RANDOM weights)", file=sys.stderr, flush=True)
        synth(s, gguf, a.quant)
    size = gguf.stat().st_size
    kv = s.layers * 2 * s.kv_heads * s.head_dim  # values a token adds to the cache
    row = {"shape": name, "quant": a.quant, "random_weights": True, "file_bytes": size,
           "kv_bytes_per_token": {"duet_f32": kv * 4, "llama.cpp_f16": kv * 2}}  # fmt: skip
    print(f"[scale] {name}: Duet first and cached load", file=sys.stderr, flush=True)
    d = duet_loads(gguf, work, a.threads, a.max_tokens)
    env = d.pop("env")
    row["duet"] = d
    if not a.no_pass_cost:
        row["duet"]["pass_cost"] = pass_cost(gguf, env, a.threads)
    if not a.no_peers:
        print(f"[scale] {name}: llama-server", file=sys.stderr, flush=True)
        row["llama.cpp"] = llamacpp(gguf, a.threads, a.max_tokens)
    return row


def table(rows: list[dict]) -> str:
    head = ("shape", "file MB", "1st load s", "1st peak/file", "cached s", "cached peak/file",
            "disk/file", "Duet tok/s", "llama tok/s", "ratio", "llama start s",
            "llama peak/file", "pass5/pass1")  # fmt: skip
    lines = [" | ".join(head)]
    for r in rows:
        f, d, ll = r["file_bytes"], r["duet"], r.get("llama.cpp", {})
        pc = d.get("pass_cost", {}).get("ratio", {})
        lt = ll.get("tokens_per_s")
        cells = (r["shape"], f"{f / 1e6:,.0f}", f"{d['first_load_s']:.1f}",
                 f"{d['first_peak_bytes'] / f:.2f}", f"{d['cached_s']:.1f}",
                 f"{d['cached_peak_bytes'] / f:.2f}", f"{d['disk_bytes'] / f:.2f}",
                 f"{d['tokens_per_s']:.1f}", f"{lt:.1f}" if lt else "-",
                 f"{d['tokens_per_s'] / lt:.2f}" if lt else "-",
                 f"{ll['start_s']:.1f}" if ll else "-",
                 f"{ll['peak_bytes'] / f:.2f}" if ll.get("peak_bytes") else "-",
                 f"{pc['5']:.2f}" if pc else "-")  # fmt: skip
        lines.append(" | ".join(cells))
    return "\n".join([*lines, "(every figure: a GGUF of the shape with RANDOM weights)"])


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    rows = [measure(n.strip(), a) for n in a.shapes.split(",") if n.strip()]
    print(json.dumps({"rows": rows, "threads": a.threads}, indent=1) if a.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
