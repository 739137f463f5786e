"""Weights already on a 4-bit block grid (a GGUF's Q4_0 / Q4_1 blocks) kept exactly, not
requantized.

A checkpoint dequantized from a Q4_1 GGUF holds, in every block of 32 input channels of every
column, w = d q + m with q in [0, 15] (Q4_0 and Q4_K's sub-blocks too; a Q4_K block's levels
need not reach 0 and 15, so its step d is read from the gaps between its values).
Requantizing those values to symmetric int4 rounds them a second time (SmolLM2-135M: 75 %
top-1 agreement with float32). Here each block's own (d, m, q) is recovered from its min and
max and written as
    y = MatMulNBits(x; q, scale d) + blocksum(x) @ M
where MatMulNBits has no zero-point input (its implicit zero point is 8: it computes d (q - 8)),
blocksum(x) sums x over each block of 32 input channels (B, T, K/32) and M (K/32, N) holds the
blocks' m + 8 d. The symmetric form on purpose: at accuracy level 4, ONNX Runtime 1.32's kernel
with an explicit zero point gave a one-token pass and a multi-token pass logits up to 1.07 apart
on SmolLM2 (greedy sd then differed from ar); without one the two agree exactly, so the target's
output does not depend on how many tokens a pass verifies. Exact up to MatMulNBits' int8
activations (SmolLM2: 97.1 % agreement with the fused sums below; the layers are the GGUF's own,
as llama.cpp runs them).

blocksum(x) comes out of the same MatMulNBits: K/32 more output columns whose
blocks are 1 on their own block of 32 input channels and 0 elsewhere (q 9 and 8 at scale 1,
exact on the grid), split off its output. At accuracy level 4 that sums the block's int8-rounded
activations, as llama.cpp's Q4_1 x Q8_1 dot does with its Q8_1 block sums. Against a Reshape
and a ReduceSum per input it is one node (a Split) in place of two and ~2-8 % more columns; the
correction's four small nodes a weight were ~2 ms of SmolLM2-135M's ~11 ms one-token pass
(ONNX Runtime's per-node cost, not their arithmetic). The block sums are computed once per input
tensor (q|k|v share one). A weight that is not on such a grid is left for the ordinary quantizer.
"""

from __future__ import annotations

import numpy as np
from onnx import helper as oh
from onnx import numpy_helper as onh

MS = "com.microsoft"
GRID_TOL = 1e-5  # max |w - (m + d q)| relative to the weight's max |w|


def grid_of(W: np.ndarray, block: int):
    """(q (N, nb, block) in [0, 15], d (N, nb), m (N, nb)) when the (K, N) weight lies on a
    4-bit grid per block of `block` input channels, else None."""
    K, N = W.shape
    if K % block:
        return None
    Wb = W.T.reshape(N, K // block, block)
    tol = GRID_TOL * max(float(np.abs(W).max()), 1e-30)
    m, mx = Wb.min(-1), Wb.max(-1)
    got = _on_grid(Wb, m, (mx - m) / 15, tol)  # Q4_0 / Q4_1: each block spans its 16 levels
    if got is None and _gap_grid(Wb[:4], m[:4], tol) is not None:  # a few columns first: cheap
        got = _gap_grid(Wb, m, tol)  # Q4_K: a block's levels need not reach both ends
    return got


def _gap_grid(Wb, m, tol):
    """_on_grid with each block's step read as the smallest gap between its sorted values."""
    gaps = np.diff(np.sort(Wb, axis=-1), axis=-1)
    step = np.where(gaps > tol, gaps, np.inf).min(-1)
    return _on_grid(Wb, m, np.where(np.isinf(step), 0.0, step), tol)


def _on_grid(Wb, m, d, tol):
    """(q, d, m) when every block of Wb is m + d q with q in [0, 15] within tol, else None."""
    safe = np.where(d == 0, 1.0, d)
    q = np.rint((Wb - m[..., None]) / safe[..., None])
    if q.max() > 15:
        return None
    err = np.abs(m[..., None] + d[..., None] * q - Wb).max()
    if err > tol:
        return None
    return q.astype(np.uint8), d.astype(np.float32), m.astype(np.float32)


def _pack(u: np.ndarray) -> np.ndarray:
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def keep_grids(model, block: int, accuracy_level: int, skip: set[str]) -> list[str]:
    """Rewrite every MatMul whose constant weight lies on a 4-bit grid (not in `skip`), in place;
    returns the names of the correction MatMuls it added (float; the quantizer must skip them).
    blocksum(x) comes from indicator columns of the input's first MatMulNBits."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    sums: dict[str, str] = {}
    added: list[str] = []
    for node in list(g.node):
        if node.op_type != "MatMul" or node.name in skip or node.input[1] not in inits:
            continue
        init = inits[node.input[1]]
        W = onh.to_array(init).astype(np.float32)
        got = grid_of(W, block)
        if got is None:
            continue
        q, d, m = got
        K, N = W.shape
        nb = K // block
        x, n = node.input[0], node.name
        at = list(g.node).index(node)
        new, extra = [], 0
        if x not in sums:  # blocksum(x) as nb more columns of this MatMulNBits
            ind = np.full((nb, nb, block), 8, np.uint8)
            ind[np.arange(nb), np.arange(nb)] = 9  # d (q - 8): 1 on the column's own block
            q = np.concatenate([q, ind])
            d = np.concatenate([d, np.ones((nb, nb), np.float32)])
            extra = nb
            split = f"{n}.sums_split"
            g.initializer.append(onh.from_array(np.array([N, nb], np.int64), split))
            new.append(
                oh.make_node(
                    "Split",
                    [f"{n}.dq_sums", split],
                    [f"{n}.dq", f"{x}.blocksum"],
                    name=f"{n}.sums",
                    axis=-1,
                )
            )
            sums[x] = f"{x}.blocksum"
        # the symmetric form (no zero-point input, implicit zero point 8): d (q - 8) + (m + 8 d)
        shift = (m + 8 * d[:N]).T  # (nb, N)
        g.initializer.extend(
            [
                onh.from_array(_pack(q), f"{n}.q"),
                onh.from_array(d.reshape(-1), f"{n}.d"),
                onh.from_array(np.ascontiguousarray(shift, dtype=np.float32), f"{n}.m"),
            ]
        )
        dq = oh.make_node(
            "MatMulNBits",
            [x, f"{n}.q", f"{n}.d"],
            [f"{n}.dq_sums" if extra else f"{n}.dq"],
            name=f"{n}.dq",
            domain=MS,
            K=K,
            N=N + extra,
            bits=4,
            block_size=block,
            accuracy_level=accuracy_level,
        )
        new = [
            dq, *new,
            oh.make_node("MatMul", [sums[x], f"{n}.m"], [f"{n}.mm"], name=f"{n}.grid_min"),
            oh.make_node("Add", [f"{n}.dq", f"{n}.mm"], list(node.output), name=f"{n}.add"),
        ]  # fmt: skip
        g.node.remove(node)
        for j, nn in enumerate(new):
            g.node.insert(at + j, nn)
        g.initializer.remove(init)
        added.append(f"{n}.grid_min")
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(oh.make_opsetid(MS, 1))
    return added
