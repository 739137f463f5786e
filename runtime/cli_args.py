"""Command-line flags every command that loads a target/draft pair shares.

The methods' flags (--gamma, --kappa, --tree-k, ...) come from the methods' Options:
runtime/cli_args_methods.py; `--method auto`'s flags and chooser: runtime/cli_args_auto.py
(both re-exported here for the commands).
"""

from __future__ import annotations

import argparse
import sys

import converters  # noqa: F401 (registers the on-the-fly exports the engine asks for: STYLE 11)
from runtime.cli_args_auto import (  # noqa: F401 (re-exported for the commands)
    AUTO,
    CORRECTION_MIN_TOKENS,
    PROBE_TOKENS,
    AutoOptions,
    add_auto_args,
    alone_chooser,
    attach_alone_draft,
    auto_announcement,
    auto_chooser,
    auto_options,
    own_draft,
)
from runtime.cli_args_methods import (  # noqa: F401 (re-exported for the commands)
    DEFAULT_GAMMA,
    add_gamma_arg,
    add_method_args,
    check_decoding_args,
    check_method_args,
    method_kwargs,
    resolve_gamma,
)
from runtime.loading import TARGET_BACKENDS, Pair, load_pair, resolve
from runtime.placement import QUANTIZE


def add_pair_args(ap: argparse.ArgumentParser) -> None:
    """--target, --adapter, --draft, their backends, the draft's threads and ONNX Runtime
    provider."""
    ap.add_argument("--target", help="target: HF/MLX directory or Hub id (default: embedded pair)")
    ap.add_argument(
        "--adapter",
        default=None,
        help="LoRA adapter dir (PEFT format) for the target, merged at load",
    )
    ap.add_argument(
        "--draft",
        help="draft: HF directory, exported .onnx, Hub id, `mtp` (the target checkpoint's own "
        "multi-token-prediction head), `head` (the feature-level head `python -m apps.train "
        "eagle` fitted beside the target), a model-free draft for sd/tree: `lookup` (prompt "
        "lookup over n-grams of the prompt and answer), `suffix` (SuffixDecoding: suffix tries "
        "over them), `suffix:FILE` (and a corpus file), or a head with one of them beside it "
        "for sd: `head+suffix`, `head+lookup`, `mtp+suffix`, `mtp+lookup` (the text's chain "
        "when it predicts well, else the head's) (default: embedded pair)",
    )
    ap.add_argument(
        "--target-backend",
        choices=TARGET_BACKENDS,
        default="auto",
        help="runs the target: auto = this machine's fastest at the model's own precision: "
        "MLX on macOS; on a CPU a GGUF runs on ONNX Runtime from its own quantized blocks, and "
        "a float checkpoint in float32 on PyTorch or ONNX Runtime, whichever a probe measures "
        "faster (once per model and machine, kept; --reprobe measures again); onnx = ONNX "
        "Runtime, exported once and cached beside the checkpoint (default auto)",
    )
    ap.add_argument(
        "--quantize",
        choices=QUANTIZE,
        default="auto",
        help="ONNX target weights: auto = the model's own precision (a GGUF keeps its own "
        "4-bit blocks, its finer ones at 8 bits; a float checkpoint stays float32); int4/int8 "
        "= block-wise MatMulNBits (blocks of 32, int8 activations), requantized from a float "
        "checkpoint, and the target then runs on ONNX Runtime; none = float32; a hybrid runs "
        "float32 (default auto)",
    )
    ap.add_argument(
        "--target-device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="PyTorch target: cpu, or cuda (a GPU; the draft stays on the CPU) (default cpu)",
    )
    ap.add_argument(
        "--target-threads",
        type=int,
        default=None,
        help="PyTorch target threads, or the ONNX target's intra-op threads (default: "
        "the cores the draft leaves; every core for an ONNX target with no draft model)",
    )
    ap.add_argument(
        "--draft-backend",
        choices=["onnx", "mlx", "torch"],
        default=None,
        help="runs the draft (default onnx; a directory is exported on the fly and cached)",
    )
    ap.add_argument(
        "--draft-threads",
        type=int,
        default=1,
        help="ONNX Runtime intra-op threads for the draft (default 1)",
    )
    ap.add_argument(
        "--hybrid-rollback",
        choices=["replay", "redecode"],
        default="replay",
        help="hybrid (Qwen3.5) linear-attention states after a rejection: replay "
        "(no second pass: pick the state the verify pass kept, or replay the "
        "kept recurrence steps), or redecode (llama.cpp: restore a checkpoint, "
        "re-run the accepted tokens) (default replay)",
    )
    ap.add_argument(
        "--provider",
        default="cpu",
        help="ONNX Runtime execution provider: cpu, coreml, cuda, tensorrt, qnn (default cpu)",
    )
    ap.add_argument(
        "--draft-process",
        action="store_const",
        const=True,
        default=None,
        help="mirror: run the draft worker in its own process (shared-memory channel) "
        "instead of a thread (default: a process when the target runs on CUDA or "
        "--emulate a device, else a thread)",
    )
    ap.add_argument(
        "--draft-thread",
        action="store_const",
        const=False,
        dest="draft_process",
        help="mirror: run the draft worker in a thread of the target's process, "
        "also beside a CUDA target",
    )


def load_pair_from_args(a: argparse.Namespace, *, need_draft: bool) -> Pair:
    """load_pair with the flags of add_pair_args."""
    from runtime.arg_rules import at_least

    at_least("--draft-threads", a.draft_threads)
    at_least("--target-threads", a.target_threads)
    draft, auto_alone = a.draft, getattr(a, "method", None) == AUTO and a.draft is None
    if auto_alone and a.target is not None:  # auto drafts with the target's own head, if any
        draft = own_draft(resolve(a.target, "target"))
        need_draft = need_draft or draft is not None
    pair = load_pair(
        a.target,
        draft,
        need_draft=need_draft,
        target_backend=a.target_backend,
        draft_backend=a.draft_backend,
        draft_threads=a.draft_threads,
        provider=a.provider,
        target_threads=a.target_threads,
        target_device=a.target_device,
        adapter=a.adapter,
        quantize=getattr(a, "quantize", "auto"),
        hybrid_rollback=getattr(a, "hybrid_rollback", "replay"),
        target_chooser=target_chooser(getattr(a, "reprobe", False)),
    )
    announce_target(pair.settings)
    if auto_alone and a.target is not None and draft is None:
        attach_alone_draft(pair)  # auto may run sd on a target alone (alone_chooser)
    return pair


def target_chooser(refresh: bool = False):
    """load_pair's `target_chooser`: the measured choice of devices/target_placement.py, which
    the engine cannot import (STYLE 11)."""
    from devices.target_placement import choose_target

    def choose(tdir, candidates, load):
        return choose_target(tdir, candidates, load, refresh=refresh)

    return choose


def announce_target(settings: dict) -> None:
    """One stderr line saying where the target runs and why, when that was chosen just now."""
    if settings.get("target_announce") and settings.get("target_backend_why"):
        q = settings.get("target_quantize")
        at = settings["target_backend"] + (f" ({q})" if q and q != "none" else "")
        print(f"[target on {at}: {settings['target_backend_why']}]", file=sys.stderr)
