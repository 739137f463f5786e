"""Command-line flags every command that loads a target/draft pair shares."""

from __future__ import annotations

import argparse

from runtime.load import TARGET_BACKENDS, Pair, load_pair


def add_pair_args(ap: argparse.ArgumentParser) -> None:
    """--target, --draft, their backends, the draft's threads and ONNX Runtime provider."""
    ap.add_argument("--target", help="target: HF/MLX directory or Hub id (default: embedded pair)")
    ap.add_argument(
        "--draft",
        help="draft: HF directory, exported .onnx, Hub id, or `mtp` (the target checkpoint's own "
        "multi-token-prediction head) (default: embedded pair)",
    )
    ap.add_argument("--target-backend", choices=TARGET_BACKENDS, default="auto",
                    help="runs the target: auto = mlx on macOS (Metal), torch elsewhere (default auto)")  # fmt: skip
    ap.add_argument("--target-threads", type=int, default=None,
                    help="PyTorch target threads (default: the cores the draft leaves)")  # fmt: skip
    ap.add_argument("--draft-backend", choices=["onnx", "mlx", "torch"], default=None,
                    help="runs the draft (default onnx; a directory is exported on the fly and cached)")  # fmt: skip
    ap.add_argument("--draft-threads", type=int, default=1,
                    help="ONNX Runtime intra-op threads for the draft (default 1)")  # fmt: skip
    ap.add_argument("--hybrid-rollback", choices=["replay", "redecode"], default="replay",
                    help="hybrid (Qwen3.5) linear-attention states after a rejection: replay the "
                         "kept recurrence steps, or redecode (llama.cpp: restore a checkpoint, "
                         "re-run the accepted tokens) (default replay)")  # fmt: skip
    ap.add_argument("--provider", default="cpu",
                    help="ONNX Runtime execution provider: cpu, coreml, cuda, tensorrt, qnn (default cpu)")  # fmt: skip


def load_pair_from_args(a: argparse.Namespace, *, need_draft: bool) -> Pair:
    """load_pair with the flags of add_pair_args."""
    from runtime.errors import DuetError

    if a.draft_threads < 1:
        raise DuetError(f"--draft-threads must be at least 1 (got {a.draft_threads})")
    if a.target_threads is not None and a.target_threads < 1:
        raise DuetError(f"--target-threads must be at least 1 (got {a.target_threads})")
    return load_pair(a.target, a.draft, need_draft=need_draft, target_backend=a.target_backend,
                     draft_backend=a.draft_backend, draft_threads=a.draft_threads, provider=a.provider,
                     target_threads=a.target_threads,
                     hybrid_rollback=getattr(a, "hybrid_rollback", "replay"))  # fmt: skip


def check_decoding_args(a: argparse.Namespace) -> None:
    """One clear error for an out-of-range --max-tokens, --temp, --top-p, --top-k or --gamma."""
    from runtime.errors import DuetError

    if a.max_tokens < 1:
        raise DuetError(f"--max-tokens must be at least 1 (got {a.max_tokens})")
    if a.temp < 0:
        raise DuetError(f"--temp must be >= 0 (got {a.temp})")
    if not 0 < getattr(a, "top_p", 1.0) <= 1:
        raise DuetError(f"--top-p must be in (0, 1] (got {a.top_p})")
    if getattr(a, "top_k", 0) < 0:
        raise DuetError(f"--top-k must be >= 0 (got {a.top_k})")
    method = getattr(a, "method", "mirror")
    if method != "ar" and a.gamma < 1:
        raise DuetError(f"--gamma must be at least 1 for --method {method} (got {a.gamma})")
