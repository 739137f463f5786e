"""The MTP head's step in ONNX Runtime: what `--draft mtp` runs on a CPU target.

A head step is a dozen small PyTorch ops per token, whose dispatch costs more than their
arithmetic on a CPU; ONNX Runtime runs the same step graph (converters/onnx_mtp.py, the
target's embedding and LM head baked in) in one call, as the ONNX draft does. The graph is
exported once into the head's sidecar folder (TARGET/.duet/mtp/step.onnx) and re-exported
when the head's weights are newer. By default the step runs its int8-weight twin
(step.int8.onnx, converters/onnx_mtp.py quantize_mtp_onnx, made from step.onnx the same
way): a one-token step is memory-bound matrix-vector work, and the head (a 2H -> H fc, one
layer of the target's width, the target's LM head) reads about twice the embedded draft's
bytes in fp32. `quant="fp32"` runs the float graph, the parity twin of TorchMTPStep. Same
interface as mtp.torch.TorchMTPStep, numpy arrays.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.errors import DuetError
from runtime.model import causal_mask
from runtime.paths import is_stale

STEP_FILES = {"fp32": "step.onnx", "int8": "step.int8.onnx"}
QUANTS = tuple(STEP_FILES)


class OnnxMTPStep:
    """One head step over n entries in an ONNX Runtime session (CPU, `threads` intra-op)."""

    def __init__(self, path: Path, cfg, threads: int = 1):
        self.session, self.cfg = self.open(path, threads), cfg

    @staticmethod
    def open(path: Path, threads: int):
        """A CPU session on `path`, `threads` intra-op."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    @classmethod
    def for_target(cls, target, head, path, threads: int = 1, quant: str = "int8") -> OnnxMTPStep:
        """The step graph of `head` for checkpoint `path` (`quant`: fp32, or int8 weights),
        exported on first use and again when the head's weights are newer."""
        from runtime.drafts.mtp.weights import find_mtp_weights, mtp_sidecar

        if getattr(target, "device", None) is not None and target.device.type != "cpu":
            raise DuetError(
                "--draft mtp on ONNX Runtime needs a CPU target; use --draft-backend torch"
            )
        if quant not in STEP_FILES:
            raise DuetError(f"MTP head weights {quant!r}: choose from {', '.join(QUANTS)}")
        from runtime.backends.exporters import export  # converters/onnx_mtp.py, registered above

        _, src = find_mtp_weights(path)
        srcs = list(Path(src).glob("*.safetensors")) if Path(src).is_dir() else [Path(src)]
        fp32 = mtp_sidecar(path) / STEP_FILES["fp32"]
        out = mtp_sidecar(path) / STEP_FILES[quant]
        try:
            if is_stale(fp32, srcs):
                export("onnx-mtp", target.module, head, fp32, source=path)
            if quant == "int8" and is_stale(out, [fp32]):
                export("onnx-mtp-int8", fp32, out, target.config, source=path)
        except OSError as e:
            raise DuetError(
                f"{out}: cannot write the MTP head's ONNX export ({e}); use --draft-backend torch"
            ) from None
        return cls(out, target.config, threads)

    def empty(self, b: int) -> np.ndarray:
        """An empty (b, KV, 0, D) key or value array."""
        return np.zeros((b, self.cfg.num_kv_heads, 0, self.cfg.head_dim), np.float32)

    def hidden(self, h) -> np.ndarray:
        """The target's hidden states (n, H) as float32 numpy."""
        return h.float().cpu().numpy()

    def zeros(self, n: int) -> np.ndarray:
        """n zero hidden states (no target hidden state yet)."""
        return np.zeros((n, self.cfg.hidden_size), np.float32)

    @staticmethod
    def feed(ids: list[int], hidden: np.ndarray, j: int, past) -> dict:
        """A step graph's inputs: entries j.. for tokens `ids` reading `hidden` (n, width)."""
        n, S = len(ids), past[0].shape[2]
        return {
            "input_ids": np.array([ids], np.int64),
            "hidden": np.ascontiguousarray(hidden, np.float32)[None],
            "position_ids": np.arange(j, j + n, dtype=np.int64)[None],
            "mask": causal_mask(S, n)[None, None] if n > 1 else np.ones((1, 1, 1, S + 1), bool),
            "past_key": np.ascontiguousarray(past[0]),
            "past_value": np.ascontiguousarray(past[1]),
        }

    def __call__(self, ids: list[int], hidden: np.ndarray, j: int, past):
        """Entries j.. for tokens `ids` reading `hidden` (n, H): (outs, logits rows, (k, v))."""
        logits, out, k, v = self.session.run(None, self.feed(ids, hidden, j, past))
        return list(out[0]), list(logits[0]), (k, v)
