"""Which graph builds an ONNX target part: Gemma 3's (global and local RoPE tables, sandwich
norms; converters/onnx_target_gemma3.py) or the Llama / Qwen one (converters/onnx_target_graph.py),
picked by the PyTorch family file that holds the model's RoPE tables. Both the checkpoint export
and the GGUF import build their parts through it; it converts no weight itself."""

from __future__ import annotations

from converters.onnx_target_graph import Graph, Span, build_part


def build_family_part(family: str, cfg, state, lm, span: Span, graph: Graph | None = None):
    """The ModelProto of `span` for `family` (a runtime.backends.torch FAMILIES value), RoPE
    tables read from `lm` (the torch model, meta weights allowed); `graph` as
    onnx_target_graph.build_part's."""
    inv_freq = lm.inv_freq.detach().float().numpy()
    if family == "gemma3_text":
        from converters.onnx_target_gemma3 import build_gemma_part

        ropes = {"global": inv_freq, "local": lm.inv_freq_local.detach().float().numpy()}
        return build_gemma_part(cfg, state, ropes, span, graph)
    return build_part(cfg, state, inv_freq, span, graph)
