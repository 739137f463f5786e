"""`--peers`: other runtimes on the same model, prompts, token budget and threads, alternated
with Duet's methods in one run.

    python -m apps.bench --target smollm2-135m-instruct --peers all --threads 2

Each peer is a group of rows named GROUP:MODE, its own `ar` first:
- `llama.cpp`: `llama-server` on the GGUF the target came from (`--gguf`, default the one
  beside the checkpoint), `ar` and every n-gram `--spec-type` the built binary lists
  (apps/bench/runners/llamacpp.py);
- `ort-genai`: onnxruntime-genai on its own int4 build of the checkpoint, `ar` and its
  n-gram speculative mode (apps/bench/runners/ort_genai.py);
- `hf`: Hugging Face `generate`, `ar` and prompt-lookup assisted generation
  (apps/bench/runners/hf_lookup.py);
- `mlx-lm`: mlx-lm's `generate_step` (`ar`); its only speculative mode needs a draft model.
A row's speedup and greedy equality are against its own group's `ar` (the runner's
`own_ar`), not Duet's. A peer that cannot run here is skipped with the reason and the command
that fixes it (`skipped` in the JSON, a line under the table).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from runtime.errors import DuetError

PEERS = ("llama.cpp", "ort-genai", "hf", "mlx-lm")
MLX_NO_SPEC = (
    "mlx-lm speculates only with a draft model (speculative_generate_step); it has no "
    "model-free mode, so only mlx-lm:ar runs on a target alone"
)


def add_peer_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--peers",
        default=None,
        help=f"comma-separated peers, or `all`: {', '.join(PEERS)}; each runs its ar "
        "and its model-free speculative modes on the same model "
        "(apps/bench/runners/peers.py)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="one thread count for everyone: Duet's target (--target-threads), "
        "PyTorch (HF), llama.cpp's -t/-tb, ort-genai's intra-op threads (default: "
        "PyTorch's)",
    )
    ap.add_argument(
        "--gguf",
        default=None,
        help="llama.cpp's model (default: the .gguf beside the target checkpoint)",
    )
    ap.add_argument(
        "--gguf-draft",
        default=None,
        help="a GGUF draft model for llama.cpp's `--model-draft` row (llama.cpp:draft); "
        "without it that row is skipped with a note",
    )
    ap.add_argument(
        "--also-target-backend",
        default=None,
        choices=["torch", "onnx"],
        help="run Duet's methods a second time over this target backend, as "
        "BACKEND:METHOD rows against BACKEND:ar (e.g. PyTorch beside an int4 ONNX "
        "target)",
    )


def parse_peers(text: str | None) -> list[str]:
    if not text:
        return []
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return list(PEERS)
    bad = [p for p in names if p not in PEERS]
    if bad:
        raise DuetError(f"--peers: unknown {', '.join(bad)}; choose from {', '.join(PEERS)}, all")
    return list(dict.fromkeys(names))


def bench_threads(a) -> int:
    """--threads, else PyTorch's thread count; sets Duet's target threads when not given."""
    import torch

    if a.threads is not None:
        if a.threads < 1:
            raise DuetError(f"--threads must be at least 1 (got {a.threads})")
        torch.set_num_threads(a.threads)
        if getattr(a, "target_threads", None) is None:
            a.target_threads = a.threads
        return a.threads
    return a.target_threads or torch.get_num_threads() or os.cpu_count() or 1


def find_gguf(target_dir: Path, given: str | None) -> Path | None:
    """--gguf, else the one .gguf file beside the checkpoint folder (models/NAME/*.gguf)."""
    if given:
        return Path(given).expanduser()
    found = sorted(Path(target_dir).parent.glob("*.gguf"))
    return found[0] if len(found) == 1 else None


def peer_runners(names: list[str], pair, a, threads: int) -> tuple[list, dict]:
    """(runners, skipped): every runnable mode of every peer; `skipped` maps a row or group name
    to why it does not run here."""
    runners, skipped = [], {}
    eos = tuple(pair.target.config.eos_token_ids)
    for name in names:
        try:
            rs, sk = BUILDERS[name](pair, a, threads, eos)
        except DuetError as e:
            rs, sk = [], {f"{name}:ar": str(e)}
        runners += rs
        skipped |= sk
    return runners, skipped


def _llamacpp(pair, a, threads, eos):
    from .llamacpp import NO_GGUF_DRAFT, LlamaCppRunner, ngram_modes
    from .llamacpp_server import BUILD_COMMAND, server_binary

    binary = server_binary()
    if binary is None:
        return [], {
            "llama.cpp:ar": f"llama-server is not built here; build it once with "
            f"`{BUILD_COMMAND}` (about 9 minutes on 2 cores)"
        }
    gguf = find_gguf(pair.target_dir, a.gguf)
    if gguf is None or not gguf.is_file():
        return [], {
            "llama.cpp:ar": f"no GGUF for {pair.target_dir} (pass --gguf FILE; found "
            f"{gguf or 'none, or several, beside the checkpoint'})"
        }
    # the model's context, at most 8192 (the chat set's prompts fit; a KV of 6 servers stays small)
    ctx = min(int(getattr(pair.target.config, "max_context", 4096) or 4096), 8192)
    runners = []
    try:
        modes = [None, *ngram_modes(str(binary)), *(["draft"] if a.gguf_draft else [])]
        for mode in modes:
            runners.append(
                LlamaCppRunner(
                    str(gguf),
                    threads=threads,
                    mode=mode,
                    eos=eos,
                    draft_gguf=a.gguf_draft,
                    gamma=a.gamma,
                    ctx=ctx,
                )
            )
    except BaseException:
        for r in runners:
            r.close()
        raise
    return runners, ({} if a.gguf_draft else {"llama.cpp:draft": NO_GGUF_DRAFT})


def _genai(pair, a, threads, eos):
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return [], {
            "ort-genai:ar": "onnxruntime-genai is not installed (pip install onnxruntime-genai)"
        }
    from .ort_genai import GenaiRunner, built_model

    model = built_model(
        pair.target_dir,
        pair.target_dir.parent.name
        if pair.target_dir.name == "checkpoint"
        else pair.target_dir.name,
    )
    return [
        GenaiRunner(model, threads=threads, ngram=ng, gamma=a.gamma, eos=eos)
        for ng in (False, True)
    ], {}


def _hf(pair, a, threads, eos):
    from .hf_lookup import LOOKUP_TOKENS, HfPeerRunner

    if not Path(pair.target_dir, "config.json").is_file():
        return [], {"hf:ar": f"{pair.target_dir} is no Hugging Face checkpoint folder"}
    ar = HfPeerRunner(pair, lookup=None)
    return [ar, HfPeerRunner(pair, lookup=LOOKUP_TOKENS, shared=ar)], {}


def _mlx(pair, a, threads, eos):
    try:
        import mlx_lm  # noqa: F401
    except ImportError as e:
        return [], {"mlx-lm:ar": f"mlx-lm is not importable here ({e}); pip install mlx-lm"}
    from .mlx_lm import MlxLmRunner

    r = MlxLmRunner(replace(pair, draft=None, draft_path=None), gamma=a.gamma)
    r.name, r.group, r.own_ar = "mlx-lm:ar", "mlx-lm", "mlx-lm:ar"
    return [r], {"mlx-lm:spec": MLX_NO_SPEC}


BUILDERS = {"llama.cpp": _llamacpp, "ort-genai": _genai, "hf": _hf, "mlx-lm": _mlx}


def second_backend_runners(methods: list[str], a, make, need_draft: bool) -> list:
    """Duet's `methods` again over --also-target-backend: runners named BACKEND:METHOD whose
    own ar is BACKEND:ar; `make(methods, pair, a)` builds runners (sweep_runners)."""
    from copy import copy

    from runtime.cli_args import load_pair_from_args

    b = copy(a)
    b.target_backend = a.also_target_backend
    pair = load_pair_from_args(b, need_draft=need_draft)
    out = make(methods, pair, b)
    for r in out:
        r.name = f"{b.target_backend}:{r.name}"
        r.group, r.own_ar = b.target_backend, f"{b.target_backend}:ar"
    return out


def close_runners(runners: list) -> None:
    """Stop what the peers started (llama-server processes), whatever happened."""
    for r in runners:
        close = getattr(r, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001  (one failed stop must not leave the others running)
                pass
