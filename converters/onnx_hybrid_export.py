"""Export a hybrid Qwen3.5 (`qwen3_5_text`) draft to ONNX: the decode step (and a prefill
chunk), every state as explicit graph inputs and outputs.

The graph is the PyTorch reference (runtime/backends/torch/qwen3_5.py) traced with the
TorchScript exporter, in the optimum calling convention of onnx_export.py, T tokens per call
(T = 1, or the prefill chunk):
  inputs  input_ids (B, T) int64, attention_mask (B, past + T) int64, position_ids (B, T)
          int64, and per layer i
            full attention    past_key_values.{i}.key / .value (B, KV, past, D)
            linear attention  past_conv.{i} (B, C, K-1), past_recurrent.{i} (B, Hv, Dk, Dv) fp32
  outputs logits (B, T, V), and per layer present.{i}.key / .value (B, KV, past + T, D) or
          present_conv.{i} / present_recurrent.{i} (the states after the last token)
Batch and past are dynamic; the query length is fixed, because the reference runs the delta
rule token by token and a trace unrolls that loop for the length it saw. So an export is two
graphs: `out` takes one token (decode and draft windows: the host keeps the states after every
token, which is what makes rollback exact and free) and `<stem>.prefill.onnx` takes
DEFAULT_PREFILL tokens at once, returning only the states after the last (prompts are run
through it chunk by chunk, the rest token by token; runtime/backends/onnx/qwen3_5.py). A chunked
(parallel) form of the delta rule is not built. Static shapes and int8/int16 quantization
(onnx_static*.py) refuse hybrid checkpoints: they were not fitted in time.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from converters.onnx_io import padded_causal_mask
from runtime.backends.onnx.qwen3_5 import DEFAULT_PREFILL, hybrid_io_names, prefill_path
from runtime.backends.torch.qwen3_5 import LINEAR


class HybridStepGraph(nn.Module):
    """Qwen3_5LM over a fixed number of tokens: a 2-D padding mask, flat pasts, flat presents."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, position_ids, *past_flat):
        mask = padded_causal_mask(input_ids, attention_mask)
        past = [(past_flat[2 * i], past_flat[2 * i + 1]) for i in range(len(past_flat) // 2)]
        n = self.lm.cfg.num_layers
        h, presents = self.lm.run_layers(input_ids, 0, n, position_ids, mask, past)
        # a linear layer's present is (conv, recurrent, log): the log is the torch cache's
        return (self.lm.head(h), *[t for p in presents for t in p[:2]])


def dummy_past(lm, batch: int, past: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Zero past tensors in graph order (KV of `past` positions; empty linear states)."""
    cfg, flat = lm.cfg, []
    for layer in lm.model.layers:
        if layer.kind == LINEAR:
            flat += list(layer.linear_attn.empty_state(batch, dtype))
        else:
            kv = torch.zeros(batch, cfg.num_kv_heads, past, cfg.head_dim, dtype=dtype)
            flat += [kv, kv.clone()]
    return flat


def export_hybrid_onnx(
    lm, out: Path, dtype: torch.dtype = torch.float32, prefill: int = DEFAULT_PREFILL
) -> None:
    """Trace `lm` (a Qwen3_5LM) to the one-token graph `out` and the `prefill`-token graph
    beside it (prefill_path(out)); 0 skips the prefill graph."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _trace(lm, out, 1, dtype)
    if prefill > 1:
        _trace(lm, prefill_path(out), prefill, dtype)


def _trace(lm, out: Path, length: int, dtype: torch.dtype) -> None:
    from converters.onnx_io import trace_onnx

    B, P = 2, 3  # dummy sizes; batch and past are declared dynamic, the length is not
    ids = torch.zeros(B, length, dtype=torch.int64)
    am = torch.ones(B, P + length, dtype=torch.int64)
    pos = torch.arange(P, P + length, dtype=torch.int64)[None].repeat(B, 1)
    ins, outs = hybrid_io_names(lm.cfg)
    dyn = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch", 1: "total"},
           "position_ids": {0: "batch"}, "logits": {0: "batch"}}  # fmt: skip
    for n in ins[3:] + outs[1:]:
        dyn[n] = {0: "batch", 2: "past" if n.startswith("past_key") else "total"}
        if "conv" in n or "recurrent" in n:
            dyn[n] = {0: "batch"}
    args = (ids, am, pos, *dummy_past(lm, B, P, dtype))
    # quiet: TracerWarnings too, the token loop is meant to unroll
    trace_onnx(HybridStepGraph(lm), args, out, ins, outs, dyn, quiet=(Warning,))
