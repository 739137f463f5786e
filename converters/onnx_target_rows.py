"""Attention of the ONNX target graph as rows: a window of tokens over a past runs through
GroupQueryAttention's one-token path, one batch row per token, each row with its own past.

Why: at MatMulNBits accuracy level 4 (int8 activations) every matmul and norm gives a token's
row bit for bit the same whether it is verified in a window or alone, but GroupQueryAttention's
CPU kernel does not: a T-token window over a past and T one-token calls differ by ~1e-6 (its
multi-row and one-row paths accumulate in different orders), which the int8 rounding of the next
layer's activations amplifies (SmolLM2-135M: 0.84 logits apart after 30 layers; greedy sd then
leaves ar's tokens). As rows, every token of every pass goes through the same one-token path
over exactly the keys it may see, so a verify window equals the one-token passes that ar makes.

The host (runtime/backends/onnx/target_rows.py) feeds, per attention kind (`tag`: "" for the
global layers, "local_" for Gemma 3's sliding ones), for R = B T rows of one token:
  {tag}kv_index  (R, KV, L) int64   row r's past, as indices into this layer's present (the past
                                    and the window's keys, (B, KV, S, D) flattened to (B KV S, D)):
                                    the columns its mask allows before its own, in order (a tree
                                    node's ancestors, a branch row's kept keys), then padding
  {tag}seqlens_k (R,) int32         how many of them it sees (GQA's seqlens_k)
  {tag}gqa_mask  (R, 1, L) bool     all True (GQA's attention_bias, 0 / float32 min): the mask is
                                    in the gather, so a row sums its keys where a one-token
                                    pass over the same keys has them
Under the recipe's attention "rows" every pass runs so, a prefill too (the host,
runtime/backends/onnx/target_rows.py, says why and what it costs; the default, "window", is
GroupQueryAttention over the whole pass: converters/onnx_target_graph.py). The layer's present
(the host's cache) is Concat(past, window keys) in column order.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper as oh

MS = "com.microsoft"
NEG = float(np.finfo(np.float32).min)


def row_inputs(g, ins: list, tag: str, kv: int) -> dict:
    """Declare one attention kind's row inputs; returns what row_attention reads."""
    names = {n: f"{tag}{n}" for n in ("kv_index", "seqlens_k", "gqa_mask")}
    ins += [
        oh.make_tensor_value_info(names["kv_index"], TP.INT64, ["rows", kv, f"{tag}L"]),
        oh.make_tensor_value_info(names["seqlens_k"], TP.INT32, ["rows"]),
        oh.make_tensor_value_info(names["gqa_mask"], TP.BOOL, ["rows", "row_seq", f"{tag}total"]),
    ]
    t = g.n
    bias = g.op(
        "Where",
        [
            names["gqa_mask"],
            g.init(f"zero_{t}", np.array(0, np.float32)),
            g.init(f"neg_{t}", np.array(NEG, np.float32)),
        ],
    )
    bias = g.op("Unsqueeze", [bias, g.init(f"ax1_{t}", np.array([1], np.int64))])
    total = g.op(
        "Cast", [g.op("Squeeze", [g.op("Shape", [names["gqa_mask"]], start=2, end=3)])], to=TP.INT32
    )
    rows = g.op("Shape", [names["seqlens_k"]])  # (1,): R
    minus1 = g.init(f"m1_{t}", np.array([-1], np.int64))
    bt = g.op("Shape", ["position_ids"])  # (2,): B, T
    return {
        "kv_index": names["kv_index"],
        "seqlens_k": names["seqlens_k"],
        "bias": bias,
        "total": total,
        "rows": rows,
        "minus1": minus1,
        "bt": bt,
    }


def _shape(g, *dims) -> str:
    return g.op("Concat", list(dims), axis=0)


def row_attention(
    g,
    r: dict,
    q: str,
    k: str,
    v: str,
    past_k: str,
    past_v: str,
    heads: int,
    kv: int,
    d: int,
    scale: float,
) -> tuple[str, str, str]:
    """(attention output (B, T, H D), present key, present value) of a layer; q, k, v are
    (B, T, n D) after RoPE."""
    if "shapes" not in r:  # built once per kind: reshapes between (B, T) and (R, T')
        c = lambda name, a: g.init(f"{name}_{g.n}", np.array(a, np.int64))  # noqa: E731
        r["shapes"] = {
            "q": _shape(g, r["rows"], r["minus1"], c("hd", [heads * d])),
            "kv": _shape(g, r["rows"], r["minus1"], c("kvd", [kv * d])),
            "out": _shape(g, r["bt"], c("hd", [heads * d])),
            "bnsd": c("bnsd", [0, 0, kv, d]),
            "flat": c("flat", [-1, d]),
        }
    s = r["shapes"]
    presents = []
    for x, past in ((k, past_k), (v, past_v)):  # named as the graph's outputs: no copy there
        x4 = g.op("Transpose", [g.op("Reshape", [x, s["bnsd"]])], perm=[0, 2, 1, 3])
        name = past.replace("past.", "present.", 1)
        presents.append(g.op("Concat", [past, x4], axis=2, out=name))  # (B, KV, P + T, D)
    bufs = [
        g.op("Gather", [g.op("Reshape", [p, s["flat"]]), r["kv_index"]], axis=0) for p in presents
    ]  # (R, KV, L, D)
    qr = g.op("Reshape", [q, s["q"]])
    kr, vr = (g.op("Reshape", [x, s["kv"]]) for x in (k, v))
    att = g.op(
        "GroupQueryAttention",
        [qr, kr, vr, bufs[0], bufs[1], r["seqlens_k"], r["total"], "", "", "", r["bias"]],
        3,
        domain=MS,
        num_heads=heads,
        kv_num_heads=kv,
        scale=scale,
    )[0]
    return g.op("Reshape", [att, s["out"]]), presents[0], presents[1]
