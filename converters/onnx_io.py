"""What every decoder export shares: the opset, the optimum-style I/O names, and the padded
causal mask the graphs build from `attention_mask`. The family exporters (onnx_export.py,
onnx_hybrid_export.py, onnx_gemma3_export.py, onnx_static.py, onnx_mtp.py) import it from
here, and onnx_export.py dispatches to them, so no two of them import each other.
"""

from __future__ import annotations

import torch

OPSET = 17


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order."""
    ins = ["input_ids", "attention_mask", "position_ids"]
    outs = ["logits"]
    for i in range(num_layers):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


def padded_causal_mask(input_ids, attention_mask):
    """The (B, 1, T, S) boolean mask of T new tokens over S positions: causal, and hiding the
    positions a 2-D padding `attention_mask` (B, S) zeroes (the optimum calling convention)."""
    T, S = input_ids.shape[1], attention_mask.shape[1]
    q = torch.arange(T, device=input_ids.device)[:, None] + (S - T)
    k = torch.arange(S, device=input_ids.device)[None, :]
    return (k <= q)[None, None] & attention_mask[:, None, None, :].bool()
