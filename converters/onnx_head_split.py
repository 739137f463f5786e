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


def int8_of(W: np.ndarray, block: int, top: int) -> tuple[np.ndarray, np.ndarray]:
    """(q8 (N, nb, block) int8 in [-top, top], scales (N, nb) float32) of a (K, N) weight:
    symmetric blocks of `block` along K (zero-padded), s = the block's max |w| / top."""
    K, N = W.shape
    nb = -(-K // block)
    Wp = np.zeros((nb * block, N), np.float32)
    Wp[:K] = W
    Wb = Wp.T.reshape(N, nb, block)
    s = np.abs(Wb).max(-1) / top
    s = np.where(s == 0, 1.0, s).astype(np.float32)
    q8 = np.clip(np.rint(Wb / s[..., None]), -top, top).astype(np.int8)
    return q8, s


def _find(model, node_name: str):
    g = model.graph
    node = next(n for n in g.node if n.name == node_name)
    init = next(i for i in g.initializer if i.name == node.input[1])
    return g, node, init, onh.to_array(init).astype(np.float32)


def _splice(model, node, init, new: list, inits: list) -> None:
    """`new` in place of `node`, `inits` in place of its weight `init`."""
    g = model.graph
    at = list(g.node).index(node)
    g.node.remove(node)
    for j, n in enumerate(new):
        g.node.insert(at + j, n)
    g.initializer.remove(init)
    g.initializer.extend(inits)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(oh.make_opsetid(MS, 1))


def split_nodes(x: str, y: str, name: str, K: int, q8, s, block: int = 32, level: int = 4):
    """(nodes, initializers) of y = x @ W for W's 8-bit blocks (q8 in [-119, 119], scales s)
    as hi + lo 4-bit MatMulNBits."""
    N = q8.shape[0]
    his, los = [], []
    for r in range(0, N, 4096):  # a chunk of rows at a time: int16 arithmetic is 2 bytes each
        q = q8[r : r + 4096].astype(np.int16)
        lo = (q + 8) % 16 - 8  # [-8, 7]
        his.append(_pack((q - lo) // 16 + 8))  # hi in [-7, 7]
        los.append(_pack(lo + 8))
    inits = [
        onh.from_array(np.concatenate(his), f"{name}.hi.q"),
        onh.from_array((16 * s).reshape(-1), f"{name}.hi.s"),
        onh.from_array(np.concatenate(los), f"{name}.lo.q"),
        onh.from_array(s.reshape(-1), f"{name}.lo.s"),
    ]
    attrs = dict(K=K, N=N, bits=4, block_size=block, accuracy_level=level)
    y_hi, y_lo = f"{name}.hi.y", f"{name}.lo.y"
    new = [
        oh.make_node("MatMulNBits", [x, f"{name}.hi.q", f"{name}.hi.s"], [y_hi],
                     name=f"{name}.hi", domain=MS, **attrs),
        oh.make_node("MatMulNBits", [x, f"{name}.lo.q", f"{name}.lo.s"], [y_lo],
                     name=f"{name}.lo", domain=MS, **attrs),
        oh.make_node("Add", [y_hi, y_lo], [y], name=f"{name}.add"),
    ]  # fmt: skip
    return new, inits


def one8_nodes(x: str, y: str, name: str, K: int, q8, s, block: int = 32, level: int = 4):
    """(nodes, initializers) of y = x @ W as one 8-bit MatMulNBits (q8 + 128: its implicit
    zero point)."""
    inits = [onh.from_array((q8.astype(np.int16) + 128).astype(np.uint8), f"{name}.q8"),
             onh.from_array(s.reshape(-1), f"{name}.s8")]  # fmt: skip
    node = oh.make_node(
        "MatMulNBits",
        [x, f"{name}.q8", f"{name}.s8"],
        [y],
        name=f"{name}.q8mm",
        domain=MS,
        K=K,
        N=q8.shape[0],
        bits=8,
        block_size=block,
        accuracy_level=level,
    )
    return [node], inits


def split_matmul(model, node_name: str, block: int = 32, accuracy_level: int = 4) -> None:
    """Replace the MatMul `node_name` (constant (K, N) weight) by hi + lo MatMulNBits, in place."""
    _, node, init, W = _find(model, node_name)
    q8, s = int8_of(W, block, 119)
    new, inits = split_nodes(
        node.input[0], node.output[0], node_name, W.shape[0], q8, s, block, accuracy_level
    )
    _splice(model, node, init, new, inits)


def one_matmul8(model, node_name: str, block: int = 32, accuracy_level: int = 4) -> None:
    """Replace the MatMul `node_name` by one 8-bit MatMulNBits (symmetric blocks of `block`
    along the input dimension, s = max |w| / 127, stored as q8 + 128: its implicit zero point),
    in place. Only where int8 products are summed without saturation (a VNNI CPU): on AVX2
    without VNNI a pair of products can reach 2 * 255 * 127, past VPMADDUBSW's int16."""
    _, node, init, W = _find(model, node_name)
    q8, s = int8_of(W, block, 127)
    new, inits = one8_nodes(
        node.input[0], node.output[0], node_name, W.shape[0], q8, s, block, accuracy_level
    )
    _splice(model, node, init, new, inits)
