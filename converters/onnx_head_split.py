"""8-bit weights (the LM head, --quantize int8) as two 4-bit MatMulNBits: exact, and safe on
every x86-64 and arm64 CPU; or, on a CPU with VNNI (runtime/backends/onnx/target.int8_dot), as
one 8-bit MatMulNBits (`one_matmul8`), whose int8 products VPDPBUSD sums in int32.

MatMulNBits' fast path (accuracy level 4) multiplies int8 activations by the weights' integers.
With 4-bit weights a pair of products sums to at most 2 * 15 * 128 (no kernel can clip it);
8-bit weights could reach 2 * 255 * 127, past the int16 that AVX2 CPUs without VNNI sum pairs
in (VPMADDUBSW), and the 8-bit fallback paths (levels 0 and 1) were ~400x slower here on the
head (49,152 x 576: 52 ms against 0.13 ms). So 8-bit weights are written as their high and low
nibbles: q8 = 16 hi + lo with hi, lo in [-8, 7], each a symmetric 4-bit MatMulNBits (no
zero-point input: at accuracy level 4 ONNX Runtime 1.32's zero-point kernel answered a one-token
and a multi-token pass differently), scales 16 s and s; the two products add to exactly the
8-bit product. Blocks of 32 along the input dimension, s = the block's max |w| / 119 (the
largest |q8| two such nibbles reach).
"""

from __future__ import annotations

import numpy as np
from onnx import helper as oh
from onnx import numpy_helper as onh

MS = "com.microsoft"


def _pack(u: np.ndarray) -> np.ndarray:
    """(N, nb, block) values in [0, 15] -> (N, nb, block / 2) bytes, low nibble first."""
    u = u.astype(np.uint8)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def _int8_blocks(model, node_name: str, block: int, top: int):
    """(graph, node, weight initializer, K, N, q8 (N, nb, block) in [-top, top], scales (N, nb))
    of the MatMul `node_name`'s constant (K, N) weight: symmetric blocks of `block` along K
    (zero-padded), s = the block's max |w| / top."""
    g = model.graph
    node = next(n for n in g.node if n.name == node_name)
    init = next(i for i in g.initializer if i.name == node.input[1])
    W = onh.to_array(init).astype(np.float32)  # (K, N)
    K, N = W.shape
    nb = -(-K // block)
    Wp = np.zeros((nb * block, N), np.float32)
    Wp[:K] = W
    Wb = Wp.T.reshape(N, nb, block)
    s = np.abs(Wb).max(-1) / top
    s = np.where(s == 0, 1.0, s).astype(np.float32)
    q8 = np.clip(np.rint(Wb / s[..., None]), -top, top).astype(np.int16)
    return g, node, init, K, N, q8, s


def split_matmul(model, node_name: str, block: int = 32, accuracy_level: int = 4) -> None:
    """Replace the MatMul `node_name` (constant (K, N) weight) by hi + lo MatMulNBits, in place."""
    g, node, init, K, N, q8, s = _int8_blocks(model, node_name, block, 119)
    lo = (q8 + 8) % 16 - 8  # [-8, 7]
    hi = (q8 - lo) // 16  # [-7, 7]
    a = node.input[0]
    inits = [
        onh.from_array(_pack(hi + 8), f"{node_name}.hi.q"),
        onh.from_array((16 * s).reshape(-1), f"{node_name}.hi.s"),
        onh.from_array(_pack(lo + 8), f"{node_name}.lo.q"),
        onh.from_array(s.reshape(-1), f"{node_name}.lo.s"),
    ]
    attrs = dict(K=K, N=N, bits=4, block_size=block, accuracy_level=accuracy_level)
    y_hi, y_lo = f"{node_name}.hi.y", f"{node_name}.lo.y"
    new = [
        oh.make_node("MatMulNBits", [a, f"{node_name}.hi.q", f"{node_name}.hi.s"], [y_hi],
                     name=f"{node_name}.hi", domain=MS, **attrs),
        oh.make_node("MatMulNBits", [a, f"{node_name}.lo.q", f"{node_name}.lo.s"], [y_lo],
                     name=f"{node_name}.lo", domain=MS, **attrs),
        oh.make_node("Add", [y_hi, y_lo], list(node.output), name=f"{node_name}.add"),
    ]  # fmt: skip
    at = list(g.node).index(node)
    g.node.remove(node)
    for j, n in enumerate(new):
        g.node.insert(at + j, n)
    g.initializer.remove(init)
    g.initializer.extend(inits)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(oh.make_opsetid(MS, 1))


def one_matmul8(model, node_name: str, block: int = 32, accuracy_level: int = 4) -> None:
    """Replace the MatMul `node_name` by one 8-bit MatMulNBits (symmetric blocks of `block`
    along the input dimension, s = max |w| / 127, stored as q8 + 128: its implicit zero point),
    in place. Only where int8 products are summed without saturation (a VNNI CPU): on AVX2
    without VNNI a pair of products can reach 2 * 255 * 127, past VPMADDUBSW's int16."""
    g, node, init, K, N, q8, s = _int8_blocks(model, node_name, block, 127)
    inits = [onh.from_array((q8 + 128).astype(np.uint8), f"{node_name}.q8"),
             onh.from_array(s.reshape(-1), f"{node_name}.s8")]  # fmt: skip
    new = oh.make_node(
        "MatMulNBits",
        [node.input[0], f"{node_name}.q8", f"{node_name}.s8"],
        list(node.output),
        name=f"{node_name}.q8mm",
        domain=MS,
        K=K,
        N=N,
        bits=8,
        block_size=block,
        accuracy_level=accuracy_level,
    )
    at = list(g.node).index(node)
    g.node.remove(node)
    g.node.insert(at, new)
    g.initializer.remove(init)
    g.initializer.extend(inits)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(oh.make_opsetid(MS, 1))
