"""The ONNX target graph of a Gemma 3 checkpoint, op by op (the Llama family's is
converters/onnx_target_graph.py, whose fused ops and I/O it shares).

What Gemma adds, against runtime/backends/torch/gemma3_text.py (the reference):
- local sliding-window layers beside global ones, each kind with its own RoPE tables. A local
  layer holds only its window and a slack (runtime/caches/sliding.py), so its past is shorter
  than a global layer's; its row inputs (local_kv_index, ...: converters/onnx_target_rows.py)
  come from the host's local mask: the last held + T columns of the mask and keys within
  (p - window, p] of a query at p (key positions are columns' positions, not columns: tree
  nodes and branch holes stay right);
- q/k RMSNorm before RoPE, RMSNorm before and after attention and the MLP, every one Gemma's
  x / rms(x) * (1 + w): SimplifiedLayerNormalization with the weight 1 + w, in float32;
- the embedding times sqrt(hidden), a GELU-tanh gated MLP (com.microsoft FastGelu; exact GELU
  where the config says `gelu`), attention scaled by query_pre_attn_scalar^-1/2, and the
  final logits soft-capped (cap * tanh(x / cap)) where the config sets a cap.
Per layer: the residual add rides on SkipSimplifiedLayerNormalization twice (before attention
with the previous MLP's normed output, before the MLP with the normed attention output).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as oh

from converters.onnx_target_graph import (
    MS,
    Graph,
    Span,
    attention,
    attention_inputs,
    close_part,
    gated_mlp,
    head_norm,
    lm_head,
    matmul_weight,
    norm_pending,
    qkv_projection,
    residual_inputs,
    rope_tables,
    weight,
)


def build_gemma_part(cfg, state: dict, ropes: dict, span: Span, graph: Graph | None = None):
    """The ModelProto of `span`'s Gemma 3 layers (+ final norm, LM head and soft-cap with the
    head); ropes = {"global": inv_freq, "local": inv_freq} (D / 2,) each; `graph` as
    converters/onnx_target_graph.build_part's."""
    start, stop, head, rows, taps = span
    g = graph or Graph()
    sums: dict[int, str] = {}
    H, KV, D, C = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    eps = float(cfg.rms_norm_eps)
    sliding = cfg.sliding[start:stop]

    def norm_w(name: str, key: str) -> str:  # Gemma's (1 + w), folded into the weight
        return g.init(name, 1.0 + weight(state, key))

    ins, outs = [], []
    if start == 0 and start < stop:
        ins.append(oh.make_tensor_value_info("input_ids", TP.INT64, ["batch", "seq"]))
        embed = g.op(
            "Gather", [g.init("embed", weight(state, "model.embed_tokens.weight")), "input_ids"]
        )
        scale = np.array(math.sqrt(C), np.float32)  # rounded to the weights' dtype, as HF does
        h = g.op("Mul", [embed, g.init("embed_scale", scale)])
    # the last block's normed MLP output, still to be added to h (after the first part: an input)
    resid = None if start == 0 and start < stop else residual_inputs(ins, C)
    h = "hidden_in" if resid else h
    att_in = {}  # kind -> (attention inputs, cos, sin)
    if start < stop:
        ins.append(oh.make_tensor_value_info("position_ids", TP.INT64, ["batch", "seq"]))
        if not all(sliding):
            att_in[False] = (attention_inputs(g, ins, "", KV, rows),
                             *rope_tables(g, cfg, ropes["global"], ""))  # fmt: skip
        if any(sliding):
            att_in[True] = (attention_inputs(g, ins, "local_", KV, rows),
                            *rope_tables(g, cfg, ropes["local"], "_local"))  # fmt: skip
    act_op = ("Gelu", {}) if cfg.hidden_activation == "gelu" else ("FastGelu", {})
    for i, local in zip(range(start, stop), sliding, strict=True):
        p = f"model.layers.{i}."
        w_in = norm_w(f"ln_in.{i}", p + "input_layernorm.weight")
        xn, h = norm_pending(g, h, resid, w_in, eps, sums, i - 1)
        a = p + "self_attn."
        q, k, v = qkv_projection(g, state, cfg, a, i, xn)
        q = head_norm(g, q, H, D, norm_w(f"qn.{i}", a + "q_norm.weight"), eps)
        k = head_norm(g, k, KV, D, norm_w(f"kn.{i}", a + "k_norm.weight"), eps)
        a_in, cos, sin = att_in[local]
        q = g.op("RotaryEmbedding", [q, "position_ids", cos, sin], domain=MS, num_heads=H)
        k = g.op("RotaryEmbedding", [k, "position_ids", cos, sin], domain=MS, num_heads=KV)
        past = ["batch", KV, "held" if local else "past", D]
        ins += [
            oh.make_tensor_value_info(f"past.{i}.{n}", TP.FLOAT, past) for n in ("key", "value")
        ]
        att, pk, pv = attention(
            g,
            a_in,
            q,
            k,
            v,
            f"past.{i}.key",
            f"past.{i}.value",
            H,
            KV,
            D,
            float(cfg.query_pre_attn_scalar) ** -0.5,
        )
        outs += [(pk, f"present.{i}.key"), (pv, f"present.{i}.value")]
        o = g.op("MatMul", [att, g.init(f"o.{i}", matmul_weight(state, [a + "o_proj.weight"]))])
        on = g.op(
            "SimplifiedLayerNormalization",
            [o, norm_w(f"ln_post.{i}", p + "post_attention_layernorm.weight")],
            axis=-1,
            epsilon=eps,
        )
        w_pre = norm_w(f"ln_pre_ff.{i}", p + "pre_feedforward_layernorm.weight")
        xn, _, _, h = g.op(
            "SkipSimplifiedLayerNormalization", [on, h, w_pre], 4, domain=MS, epsilon=eps
        )
        down = gated_mlp(g, state, cfg, p + "mlp.", i, xn, act_op)
        resid = g.op(
            "SimplifiedLayerNormalization",
            [down, norm_w(f"ln_post_ff.{i}", p + "post_feedforward_layernorm.weight")],
            axis=-1,
            epsilon=eps,
        )
    logits = None
    if head:
        logits, h = lm_head(
            g, cfg, state, ins, h, resid, norm_w("norm", "model.norm.weight"), sums, (start, stop)
        )
        cap = float(cfg.final_logit_softcapping or 0.0)
        if cap:  # cap * tanh(x / cap)
            c = g.init("softcap", np.array(cap, np.float32))
            logits = g.op("Mul", [g.op("Tanh", [g.op("Div", [logits, c])]), c])
    return close_part(g, ins, outs, h, resid, logits, sums, taps, (start, stop))
