"""The ONNX target graph, built op by op from a Llama / Qwen2 / Qwen3 checkpoint's weights.

Not a trace of the PyTorch reference: a traced decoder is ~70 small ops a layer (RoPE
recomputed per layer, GQA by repeat and concat, the mask rebuilt), and on a 2-core CPU those
cost more than the int4 matmuls themselves (SmolLM2-135M: 2,400 nodes, ~60 % of a decode step
outside MatMulNBits). This graph is ~12 nodes a layer, the fused ops onnxruntime-genai's own
builder uses (ONNX Runtime's com.microsoft domain, CPU kernels in every build):
  SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization  RMSNorm (+ the residual add)
  MatMul over packed q|k|v and gate|up weights  (MatMulNBits once quantized)
  RotaryEmbedding  rotate-half RoPE from position_ids and cos/sin tables (any rope scaling:
                   the tables come from runtime/backends/torch/llama.rope_inv_freq)
  GroupQueryAttention  KV concat + grouped-query attention, with the explicit mask as an
                   additive attention_bias (0 / float32 min) over its built-in causal rule;
                   every mask Duet passes (causal, tree, branch rows with key holes) is causal
                   with some keys removed, so the two compose to exactly that mask (or, under
                   the recipe's attention "rows", as rows of one token over the keys each may
                   see: converters/onnx_target_rows.py)
  QuickGelu(alpha=1) SiLU
One limit of the CPU kernel: a window of several tokens over a past runs one row at a time
(batch 1); runtime/backends/onnx/target.py splits such a batch into rows.

I/O of a part [start, stop) (+ head): see converters/onnx_target_export.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as onh

from converters.onnx_target_rows import row_attention, row_inputs
from runtime.errors import DuetError

MS = "com.microsoft"
NEG = float(np.finfo(np.float32).min)
HEAD_NODE = "lm_head"  # the LM head's MatMul (quantized to its own width)


class Span(NamedTuple):
    """Which part of the stack a graph holds: layers [start, stop), the final norm and LM head
    when `head`; `rows`: attention as rows (converters/onnx_target_rows.py), else one window
    over an attention_mask input; `taps` (the whole graph only): a third output, those layers'
    outputs (`tap_output`)."""

    start: int
    stop: int
    head: bool
    rows: bool = False
    taps: tuple[int, ...] = ()


class Graph:
    """A graph under construction: nodes, initializers, unique names."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def flush(self) -> None:
        """Before the graph is closed: nothing held back here (StreamGraph writes its own)."""

    def init(self, name: str, arr) -> str:
        self.inits.append(onh.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(
        self,
        kind: str,
        ins: list[str],
        n_out: int = 1,
        domain: str = "",
        node=None,
        out=None,
        **attrs,
    ):
        self.n += 1
        outs = (
            ([out] if isinstance(out, str) else list(out))
            if out
            else [f"{kind}_{self.n}_{j}" for j in range(n_out)]
        )
        self.nodes.append(
            oh.make_node(kind, ins, outs, name=node or f"{kind}_{self.n}", domain=domain, **attrs)
        )
        return outs[0] if n_out == 1 else outs


def weight(state, key) -> np.ndarray:
    """A parameter as float32 numpy: from a torch state dict, or an array already
    (converters/gguf_target.GGUFState dequantizes one when asked, or hands the embedding
    over as its quantized rows)."""
    w = state[key]
    return w.detach().float().numpy() if hasattr(w, "detach") else w


def matmul_weight(state, keys: list[str]):
    """The (K, N) weight of a MatMul over the rows of `keys` packed (q|k|v, gate|up, one
    projection, the head): float32 from a state dict; a state that keeps its own blocks
    (converters/gguf_target.GGUFState) answers with them, for the graph to quantize."""
    if hasattr(state, "matmul_weight"):
        return state.matmul_weight(keys)
    return np.concatenate([weight(state, k) for k in keys], 0).T


def build_part(cfg, state: dict, inv_freq: np.ndarray, span: Span, graph: Graph | None = None):
    """The ModelProto of `span`'s layers (+ final norm and LM head when it has the head);
    start == stop with the head: the head alone on `hidden_in`. `graph`: the Graph to build
    into (converters/gguf_target.StreamGraph quantizes as it goes)."""
    start, stop, head, rows, taps = span
    g = graph or Graph()
    sums: dict[int, str] = {}  # layer -> the residual stream after it (a norm's added sum)
    H, KV, D, C = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    eps = float(cfg.rms_norm_eps)
    ins, outs = [], []
    if start == 0 and start < stop:
        ins.append(oh.make_tensor_value_info("input_ids", TP.INT64, ["batch", "seq"]))
        h = g.op(
            "Gather", [g.init("embed", weight(state, "model.embed_tokens.weight")), "input_ids"]
        )
    # the last block's output, still to be added to h (a part after the first: `resid_in`)
    resid = None if start == 0 and start < stop else residual_inputs(ins, C)
    h = "hidden_in" if resid else h
    if start < stop:
        ins.append(oh.make_tensor_value_info("position_ids", TP.INT64, ["batch", "seq"]))
        att_in = attention_inputs(g, ins, "", KV, rows)
        cos, sin = rope_tables(g, cfg, inv_freq, "")
    for i in range(start, stop):
        p = f"model.layers.{i}."
        w_in = g.init(f"ln_in.{i}", weight(state, p + "input_layernorm.weight"))
        xn, h = norm_pending(g, h, resid, w_in, eps, sums, i - 1, resid_first=False)
        a = p + "self_attn."
        q, k, v = qkv_projection(g, state, cfg, a, i, xn)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's D channels, before RoPE
            q = head_norm(g, q, H, D, g.init(f"qn.{i}", weight(state, a + "q_norm.weight")), eps)
            k = head_norm(g, k, KV, D, g.init(f"kn.{i}", weight(state, a + "k_norm.weight")), eps)
        q = g.op("RotaryEmbedding", [q, "position_ids", cos, sin], domain=MS, num_heads=H)
        k = g.op("RotaryEmbedding", [k, "position_ids", cos, sin], domain=MS, num_heads=KV)
        ins += [
            oh.make_tensor_value_info(f"past.{i}.{n}", TP.FLOAT, ["batch", KV, "past", D])
            for n in ("key", "value")
        ]
        att, pk, pv = attention(
            g, att_in, q, k, v, f"past.{i}.key", f"past.{i}.value", H, KV, D, float(D) ** -0.5
        )
        outs += [(pk, f"present.{i}.key"), (pv, f"present.{i}.value")]
        o = g.op("MatMul", [att, g.init(f"o.{i}", matmul_weight(state, [a + "o_proj.weight"]))])
        w_post = g.init(f"ln_post.{i}", weight(state, p + "post_attention_layernorm.weight"))
        xn, _, _, h = g.op(
            "SkipSimplifiedLayerNormalization", [o, h, w_post], 4, domain=MS, epsilon=eps
        )
        resid = gated_mlp(g, state, cfg, p + "mlp.", i, xn)
    logits = None
    if head:
        wn = g.init("norm", weight(state, "model.norm.weight"))
        logits, h = lm_head(g, cfg, state, ins, h, resid, wn, sums, (start, stop))
    return close_part(g, ins, outs, h, resid, logits, sums, taps, (start, stop))


def norm_pending(
    g: Graph,
    h: str,
    resid: str | None,
    w: str,
    eps: float,
    sums: dict[int, str],
    at: int,
    resid_first: bool = True,
) -> tuple[str, str]:
    """RMSNorm (weight `w`) of the residual stream `h`, with the block output still pending on
    it (`resid`) added first in the same fused op when there is one, the sum then recorded as
    sums[at]; returns (the normed stream, h). `resid_first`: the order of the two addends on
    the op (their sum is the same either way; each graph keeps the order it was built with)."""
    if resid is None:
        return g.op("SimplifiedLayerNormalization", [h, w], axis=-1, epsilon=eps), h
    addends = [resid, h] if resid_first else [h, resid]
    normed, _, _, h = g.op(
        "SkipSimplifiedLayerNormalization", [*addends, w], 4, domain=MS, epsilon=eps
    )
    sums[at] = h
    return normed, h


def lm_head(
    g: Graph,
    cfg,
    state: dict,
    ins: list,
    h: str,
    resid: str | None,
    wn: str,
    sums: dict[int, str],
    span: tuple[int, int],
) -> tuple[str, str]:
    """The final norm (weight `wn`; with the pending residual `resid` added first, the sum
    recorded in `sums`) and the LM head over it (over the rows the `head_rows` input picks
    when the part has layers); returns (logits, the residual stream h)."""
    start, stop = span
    eps = float(cfg.rms_norm_eps)
    hn, h = norm_pending(g, h, resid, wn, eps, sums, stop - 1)
    key = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    hn = head_rows(g, ins, hn) if start < stop else hn
    logits = g.op("MatMul", [hn, g.init("lm_head", matmul_weight(state, [key]))], node=HEAD_NODE)
    return logits, h


def close_part(
    g: Graph,
    ins: list,
    outs: list,
    h: str,
    resid: str | None,
    logits: str | None,
    sums: dict[int, str],
    taps: tuple[int, ...],
    span: tuple[int, int],
):
    """The part's ModelProto. With a head (`logits`): logits first, then the residual stream
    (a part with layers) and the taps; without: the residual stream and the pending `resid`,
    which the next part adds (residual_inputs)."""
    if logits is not None:
        outs.insert(0, (logits, "logits"))
        if span[0] < span[1]:
            outs.insert(1, (h, "hidden"))
        tap_output(g, outs, sums, taps, span)
    else:
        outs[:0] = [(h, "hidden"), (resid, "resid")]  # added by the next part (residual_inputs)
    return finish(g, ins, outs)


def tap_output(g: Graph, outs: list, sums: dict, taps: tuple[int, ...], part) -> None:
    """The whole graph's third output `taps` (B, T, len(taps) * C): the residual stream after
    each tapped layer, concatenated, as a fitted head reads it (runtime/drafts/head/torch.py).
    Each is the sum the next norm's SkipSimplifiedLayerNormalization makes anyway, so a verify
    pass records the head's input in the whole graph's one run; cutting the graph into parts
    after each tapped layer did the same in 22 ms against 15 (SmolLM2-135M int4, 5 tokens)."""
    if not taps:
        return
    if part[0] != 0 or any(i not in sums for i in taps):
        raise DuetError(f"taps {list(taps)}: the whole graph records layers 0..{part[1] - 1}")
    outs.insert(2, (g.op("Concat", [sums[i] for i in taps], axis=-1), "taps"))


def residual_inputs(ins: list, hidden: int) -> str:
    """A part after the first takes the residual stream as the part before left it: h
    (`hidden_in`) and the last block's output not yet added to it (`resid_in`), so that its
    first norm adds and normalises them in one SkipSimplifiedLayerNormalization, as the whole
    graph does. Their sum through a SimplifiedLayerNormalization differs in the last bit, which
    int8 activations grow: SmolLM2-135M int4 split after layer 2 ended 84 away (of 3,730) at
    layer 30, and its logits up to 0.8, so Mirror-SD's parts left ar. Returns "resid_in"."""
    ins += [
        oh.make_tensor_value_info(n, TP.FLOAT, ["batch", "seq", hidden])
        for n in ("hidden_in", "resid_in")
    ]
    return "resid_in"


def attention_inputs(g: Graph, ins: list, tag: str, kv: int, rows: bool) -> dict:
    """One attention kind's inputs ("" the global layers, "local_" Gemma 3's sliding ones): the
    row inputs, or a bool mask (B, T, S) as GroupQueryAttention's (attention_bias (B, 1, T, S):
    0 / float32 min, seqlens_k (B,) int32 = S - 1, total_sequence_length int32 = S)."""
    if rows:
        return row_inputs(g, ins, tag, kv)
    mask = "local_mask" if tag else "attention_mask"
    ins.append(
        oh.make_tensor_value_info(mask, TP.BOOL, ["batch", "seq", "held" if tag else "total"])
    )
    t = g.n
    bias = g.op(
        "Where",
        [
            mask,
            g.init(f"zero_{t}", np.array(0, np.float32)),
            g.init(f"neg_{t}", np.array(NEG, np.float32)),
        ],
    )
    bias = g.op("Unsqueeze", [bias, g.init(f"ax1_{t}", np.array([1], np.int64))])
    total64 = g.op("Shape", [mask], start=2, end=3)  # (1,)
    total = g.op("Cast", [g.op("Squeeze", [total64])], to=TP.INT32)
    batch = g.op("Shape", [mask], start=0, end=1)
    seqlens = g.op(
        "Cast",
        [
            g.op(
                "Expand",
                [g.op("Sub", [total64, g.init(f"one_{t}", np.array([1], np.int64))]), batch],
            )
        ],
        to=TP.INT32,
    )
    return {"window": (bias, seqlens, total)}


def attention(g: Graph, a: dict, q, k, v, past_k, past_v, heads, kv, d, scale):
    """(attention output, present key, present value) of one layer, as `a` was declared."""
    if "window" not in a:
        return row_attention(g, a, q, k, v, past_k, past_v, heads, kv, d, scale)
    bias, seqlens, total = a["window"]
    # the presents under their public names (no Identity copy): the host binds each to its
    # past's buffer, and the kernel appends in place (runtime/caches/buffer.py)
    presents = [p.replace("past.", "present.", 1) for p in (past_k, past_v)]
    return g.op(
        "GroupQueryAttention",
        [q, k, v, past_k, past_v, seqlens, total, "", "", "", bias],
        3,
        domain=MS,
        out=[f"att_{g.n}", *presents],
        num_heads=heads,
        kv_num_heads=kv,
        scale=scale,
    )


def head_rows(g: Graph, ins: list, hn: str) -> str:
    """The head's input cut to rows [from, to) of the pass (`head_rows` (2,) int64): the host
    feeds (0, T) for every row's logits, (T - 1, T) for a prefill's last (whose head then costs
    one row, not T x V: a 150-token prompt's 49,152-column head was a quarter of SmolLM2's
    prefill) and (0, 1) for a one-token pass padded to two (runtime/backends/onnx/target.py)."""
    ins.append(oh.make_tensor_value_info("head_rows", TP.INT64, [2]))
    a, b = g.op("Split", ["head_rows"], 2, axis=0)
    return g.op("Slice", [hn, a, b, g.init(f"rows_axis_{g.n}", np.array([1], np.int64))])


def rope_tables(g: Graph, cfg, inv_freq: np.ndarray, tag: str) -> tuple[str, str]:
    """RotaryEmbedding's cos and sin caches (max_context, D / 2) for one RoPE base."""
    pos = np.arange(cfg.max_context, dtype=np.float32)[:, None] * inv_freq[None, :]
    return g.init(f"cos{tag}", np.cos(pos)), g.init(f"sin{tag}", np.sin(pos))


def finish(g: Graph, ins: list, outs: list[tuple[str, str]]):
    """The ModelProto: graph outputs get their public names through Identity nodes (a copy;
    the presents, the largest, are made under their public names instead)."""
    g.flush()
    for src, name in outs:
        if src != name:
            g.nodes.append(oh.make_node("Identity", [src], [name], name=f"out_{name}"))
    out_info = [oh.make_tensor_value_info(name, TP.FLOAT, None) for _, name in outs]
    graph = oh.make_graph(g.nodes, "duet_target", ins, out_info, g.inits)
    return oh.make_model(
        graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(MS, 1)], ir_version=9
    )


def qkv_projection(g: Graph, state, cfg, a: str, i: int, xn: str) -> tuple[str, str, str]:
    """Layer i's q, k, v from one packed MatMul (and bias) over the normed input `xn`."""
    H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    wqkv = matmul_weight(state, [a + f"{n}_proj.weight" for n in "qkv"])
    qkv = g.op("MatMul", [xn, g.init(f"qkv.{i}", wqkv)])
    if cfg.attention_bias:
        bqkv = np.concatenate([weight(state, a + f"{n}_proj.bias") for n in "qkv"])
        qkv = g.op("Add", [qkv, g.init(f"qkv_b.{i}", bqkv)])
    split = g.init(f"qkv_split.{i}", np.array([H * D, KV * D, KV * D], np.int64))
    return g.op("Split", [qkv, split], 3, axis=-1)


def head_norm(g: Graph, x: str, heads: int, d: int, w: str, eps: float) -> str:
    """RMSNorm over the last D channels of (B, T, heads * D)."""
    shape = g.op("Shape", [x])
    y = g.op("Reshape", [x, g.init(f"hd_shape_{g.n}", np.array([0, 0, heads, d], np.int64))])
    y = g.op("SimplifiedLayerNormalization", [y, w], axis=-1, epsilon=eps)
    return g.op("Reshape", [y, shape])


def gated_mlp(g: Graph, state, cfg, m: str, i: int, xn: str, act=("QuickGelu", {"alpha": 1.0})):
    """Layer i's MLP `down(act(gate(xn)) * up(xn))`, gate and up as one packed MatMul; `act`
    is the gate's op and attributes (QuickGelu with alpha 1 is SiLU)."""
    wgu = matmul_weight(state, [m + "gate_proj.weight", m + "up_proj.weight"])
    gu = g.op("MatMul", [xn, g.init(f"gu.{i}", wgu)])
    gu_split = g.init(f"gu_split.{i}", np.array([cfg.intermediate_size] * 2, np.int64))
    gate, up = g.op("Split", [gu, gu_split], 2, axis=-1)
    h = g.op("Mul", [g.op(act[0], [gate], domain=MS, **act[1]), up])
    wd = matmul_weight(state, [m + "down_proj.weight"])
    return g.op("MatMul", [h, g.init(f"down.{i}", wd)])
