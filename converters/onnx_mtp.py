"""Export a target's MTP head (runtime/drafts/mtp/torch.py) as one ONNX step graph.

The graph is one head step over n entries: token ids (1, n) and the hidden states they read
(1, n, H), RoPE positions (1, n), a bool mask (1, 1, n, S + n) and the head's past keys and
values (1, KV, S, D) in; the logits under the target's LM head (1, n, V), the head's
post-norm outputs (1, n, H) and the present keys and values (1, KV, S + n, D) out. The
target's embedding and LM head are baked in, so ONNX Runtime runs a draft step with no
PyTorch call (a dozen torch ops per token cost more than the step's arithmetic on a CPU).
`export_mtp_onnx` checks the file against the PyTorch head on a probe (MTP_ONNX_ATOL); it
takes no hybrid state: the head is one attention layer.

`quantize_mtp_onnx` writes the same graph with int8 weights: every MatMul with a constant
weight (fc, the layer's projections, the LM head) becomes ONNX Runtime's weight-only
MatMulNBits (8 bits, blocks of 32 along K, symmetric; ORT's own quantizer, not a copy of it),
computed with int8 activations (accuracy_level 4). A head step reads about a quarter of the
fp32 bytes: on a CPU a one-token step is a chain of matrix-vector products bound by memory,
so that is most of its time. Lossless decoding does not depend on it (the verifier accepts
with the q the draft drew from, whatever computed it); acceptance does, slightly, so the
file is checked against the fp32 graph on the same probe (MTP_INT8_RTOL of the largest
logit). The embedding stays a float Gather (it reads one row per token).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from converters.onnx_io import trace_onnx

MTP_ONNX_ATOL = 1e-3  # float32 logits, ORT's fused kernels vs PyTorch's
MTP_INT8_RTOL = 0.05  # int8 weights and activations vs float32, of the largest |logit|
INT8_BLOCK = 32  # weights per quantization block along K (one scale each)
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
        out, k, v = self.head.step(
            x, hidden, position_ids, mask, (past_key, past_value), self.inv_freq
        )
        return out @ self.lm.T, out, k, v


def _probe(cfg, width: int | None = None) -> tuple:
    """Dummy step inputs (n = 2 entries after S = 3 past ones; n and S are dynamic); `width`:
    the hidden input's (default the target's hidden size)."""
    n, S = 2, 3
    g = torch.Generator().manual_seed(0)
    return (
        torch.randint(0, cfg.vocab_size, (1, n), generator=g),
        torch.randn(1, n, width or cfg.hidden_size, generator=g),
        torch.arange(S, S + n)[None],
        torch.ones(1, 1, n, S + n, dtype=torch.bool),
        torch.randn(1, cfg.num_kv_heads, S, cfg.head_dim, generator=g),
        torch.randn(1, cfg.num_kv_heads, S, cfg.head_dim, generator=g),
    )


def _run(path: Path, args) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(OUTPUTS, {k: np.asarray(a) for k, a in zip(INPUTS, args, strict=True)})


def _check(name: str, want, got, tol: float, what: str) -> None:
    err = float(np.abs(want - got).max())
    if err > tol * max(1.0, float(np.abs(want).max())):
        raise AssertionError(f"{what}: {name} differs by {err:.2e}")


def export_mtp_onnx(
    target_module, head, out: str | Path, graph: nn.Module | None = None, width: int | None = None
) -> Path:
    """Write the step graph of `head` (an MTPHead for `target_module`, or `graph`: another step
    module with the same I/O, its hidden input `width` wide) to `out`; parity-checked."""
    cfg = target_module.cfg
    graph = (graph or MTPStepGraph(target_module, head)).float().eval()
    args = _probe(cfg, width)
    dyn = {"input_ids": {1: "n"}, "hidden": {1: "n"}, "position_ids": {1: "n"},
           "mask": {2: "n", 3: "total"}, "past_key": {2: "past"}, "past_value": {2: "past"},
           "logits": {1: "n"}, "out_hidden": {1: "n"}, "present_key": {2: "total"},
           "present_value": {2: "total"}}  # fmt: skip
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    # every warning quiet: the TorchScript exporter's deprecation and tracer notes
    trace_onnx(graph, args, tmp, INPUTS, OUTPUTS, dyn, quiet=(Warning,))
    with torch.inference_mode():
        want = graph(*args)
    got = _run(tmp, [a.numpy() for a in args])
    for name, w, g in zip(OUTPUTS, want, got, strict=True):
        _check(name, w.numpy(), g, MTP_ONNX_ATOL, "MTP ONNX export vs PyTorch")
    tmp.replace(out)
    return out


def quantize_mtp_onnx(src: str | Path, out: str | Path, cfg, width: int | None = None) -> Path:
    """Write `src` (an fp32 step graph) with int8 weight-only MatMulNBits to `out`; checked
    against `src` on the export's probe (logits within MTP_INT8_RTOL of the largest)."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    src, out = Path(src), Path(out)
    tmp = out.with_name(out.name + ".tmp")
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)  # it logs every node it skips at INFO
    try:
        q = MatMulNBitsQuantizer(
            onnx.load(str(src)), bits=8, block_size=INT8_BLOCK, is_symmetric=True, accuracy_level=4
        )
        q.process()
        q.model.save_model_to_file(str(tmp))
    finally:
        log.setLevel(level)
    args = [a.numpy() for a in _probe(cfg, width)]
    want, got = _run(src, args)[0], _run(tmp, args)[0]
    _check("logits", want, got, MTP_INT8_RTOL, "MTP int8 ONNX vs fp32")
    tmp.replace(out)
    return out
