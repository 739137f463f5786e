"""Export a target's MTP head (runtime/backends/torch_mtp.py) as one ONNX step graph.

The graph is one head step over n entries: token ids (1, n) and the hidden states they read
(1, n, H), RoPE positions (1, n), a bool mask (1, 1, n, S + n) and the head's past keys and
values (1, KV, S, D) in; the logits under the target's LM head (1, n, V), the head's
post-norm outputs (1, n, H) and the present keys and values (1, KV, S + n, D) out. The
target's embedding and LM head are baked in, so ONNX Runtime runs a draft step with no
PyTorch call (a dozen torch ops per token cost more than the step's arithmetic on a CPU).
`export_mtp_onnx` checks the file against the PyTorch head on a probe (MTP_ONNX_ATOL). It
does not quantize, and it takes no hybrid state: the head is one attention layer.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from converters.onnx_export import OPSET

MTP_ONNX_ATOL = 1e-3  # float32 logits, ORT's fused kernels vs PyTorch's
INPUTS = ["input_ids", "hidden", "position_ids", "mask", "past_key", "past_value"]
OUTPUTS = ["logits", "out_hidden", "present_key", "present_value"]


class MTPStepGraph(nn.Module):
    """embed -> MTP head step -> LM head, with the head's KV as explicit I/O."""

    def __init__(self, target_module, head):
        super().__init__()
        m = target_module
        self.embed, self.head = m.model.embed_tokens, head
        tied = m.cfg.tie_word_embeddings
        self.lm = m.model.embed_tokens.weight if tied else m.lm_head.weight
        self.register_buffer("inv_freq", m.inv_freq.clone(), persistent=False)

    def forward(self, input_ids, hidden, position_ids, mask, past_key, past_value):
        x = self.embed(input_ids)
        out, k, v = self.head.step(x, hidden, position_ids, mask, (past_key, past_value),
                                   self.inv_freq)  # fmt: skip
        return out @ self.lm.T, out, k, v


def export_mtp_onnx(target_module, head, out: str | Path) -> Path:
    """Write the step graph of `head` (an MTPHead for `target_module`) to `out`; parity-checked."""
    cfg = target_module.cfg
    graph = MTPStepGraph(target_module, head).float().eval()
    n, S = 2, 3  # dummy sizes; n and S are dynamic
    args = (torch.zeros(1, n, dtype=torch.int64), torch.randn(1, n, cfg.hidden_size),
            torch.arange(S, S + n)[None], torch.ones(1, 1, n, S + n, dtype=torch.bool),
            torch.randn(1, cfg.num_kv_heads, S, cfg.head_dim),
            torch.randn(1, cfg.num_kv_heads, S, cfg.head_dim))  # fmt: skip
    dyn = {"input_ids": {1: "n"}, "hidden": {1: "n"}, "position_ids": {1: "n"},
           "mask": {2: "n", 3: "total"}, "past_key": {2: "past"}, "past_value": {2: "past"},
           "logits": {1: "n"}, "out_hidden": {1: "n"}, "present_key": {2: "total"},
           "present_value": {2: "total"}}  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(graph, args, str(tmp), input_names=INPUTS, output_names=OUTPUTS,
                          dynamic_axes=dyn, opset_version=OPSET, dynamo=False)  # fmt: skip
        want = graph(*args)
    import onnxruntime as ort

    got = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"]).run(
        OUTPUTS, {k: a.numpy() for k, a in zip(INPUTS, args, strict=True)}
    )
    for name, w, g in zip(OUTPUTS, want, got, strict=True):
        err = float(np.abs(w.numpy() - g).max())
        if err > MTP_ONNX_ATOL * max(1.0, float(np.abs(w.numpy()).max())):
            raise AssertionError(f"MTP ONNX export: {name} differs from PyTorch by {err:.2e}")
    tmp.replace(out)
    return out
