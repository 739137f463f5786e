"""Export a fitted feature-level head (runtime/drafts/head/torch.py) as ONNX step graphs.

The head is stepped on two kinds of input: the target's taps (n_taps x H wide, fused by the
head) for entries the target has verified, and its own previous output (H wide) when it
chains. A traced graph fixes that branch, so there are two graphs with one I/O (that of
converters/onnx_mtp.py: token ids, hidden, RoPE positions, a bool mask, the head's past keys
and values in; logits, post-norm outputs, present keys and values out): `step.taps` and
`step.chain`. Their logits are the head's own LM head over its kept ids (FR-Spec), not the
target's vocabulary; runtime/drafts/head/onnx.py scatters them. Each is exported float32,
parity-checked against the PyTorch head, then written with int8 weights (onnx_mtp's
quantize_mtp_onnx: ONNX Runtime's MatMulNBits quantizer), checked against the float graph.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from converters.onnx_mtp import export_mtp_onnx, quantize_mtp_onnx
from runtime.drafts.head.onnx import KINDS, step_files


class EagleStepGraph(nn.Module):
    """embed -> head step -> the head's LM head (kept ids), the head's KV as explicit I/O."""

    def __init__(self, target_module, head):
        super().__init__()
        from runtime.backends.torch.llama import rope_inv_freq

        self.embed, self.head = target_module.model.embed_tokens, head
        self.register_buffer("inv_freq", rope_inv_freq(target_module.cfg).clone(), persistent=False)

    def forward(self, input_ids, hidden, position_ids, mask, past_key, past_value):
        out, k, v = self.head.step(
            self.embed(input_ids), hidden, position_ids, mask, (past_key, past_value), self.inv_freq
        )
        return self.head.lm_head(out), out, k, v


def export_eagle_onnx(target_module, head, folder: Path, quant: str = "int8") -> dict:
    """Write both step graphs of `head` into `folder` (float32, then int8 unless `quant` is
    fp32); returns step_files(folder, quant)."""
    cfg = target_module.cfg
    graph = EagleStepGraph(target_module, head)
    widths = {"taps": head.n_taps * cfg.hidden_size, "chain": cfg.hidden_size}
    fp32, want = step_files(folder, "fp32"), step_files(folder, quant)
    for kind in KINDS:
        export_mtp_onnx(target_module, head, fp32[kind], graph=graph, width=widths[kind])
        if quant != "fp32":
            quantize_mtp_onnx(fp32[kind], want[kind], cfg, width=widths[kind])
    return want
