"""ConcatKVCache.keep_columns / compact (the commit of a verified tree, and of a branch row)
keep the leading run as a slice and gather only the rest: the result must equal a plain
gather of every kept column, on NumPy (ONNX draft) and torch (PyTorch target) arrays."""

import numpy as np
import pytest
import torch

from runtime.caches.concat import ConcatKVCache

LAYERS, B, KV, S, D = 3, 2, 2, 12, 4
PATTERNS = [
    [*range(12)],  # everything: a no-op
    [*range(7)],  # a trim
    [*range(5), 8, 10],  # prefix + accepted tree nodes
    [*range(5), 5, 9],  # the first accepted node already in place
    [3, 4, 1],  # no leading run
    [],  # nothing
]


def filled(kind: str) -> tuple[ConcatKVCache, list]:
    rng = np.random.default_rng(0)
    arrays = [
        (rng.standard_normal((B, KV, S, D)), rng.standard_normal((B, KV, S, D)))
        for _ in range(LAYERS)
    ]
    if kind == "torch":
        arrays = [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in arrays]
    empty = (lambda b: np.zeros((b, KV, 0, D))) if kind == "numpy" else None
    c = ConcatKVCache(LAYERS, B, empty or (lambda b: torch.zeros(b, KV, 0, D)))
    for i, (k, v) in enumerate(arrays):
        c.put(i, k, v)
    return c, arrays


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("cols", PATTERNS)
def test_keep_columns_equals_a_plain_gather(kind, cols):
    c, arrays = filled(kind)
    c.keep_columns(cols)
    assert c.offset == len(cols) and all(c.layer_offset(i) == len(cols) for i in range(LAYERS))
    for i, (k, v) in enumerate(arrays):
        got_k, got_v = c.get(i)
        np.testing.assert_array_equal(np.asarray(got_k), np.asarray(k)[:, :, cols])
        np.testing.assert_array_equal(np.asarray(got_v), np.asarray(v)[:, :, cols])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_compact_moves_accepted_nodes_after_the_prefix(kind):
    c, arrays = filled(kind)
    c.compact(6, [7, 9, 11])  # a 6-token prefix, then accepted nodes 1, 3, 5 of the window
    want = [*range(6), 7, 9, 11]
    assert c.offset == 9
    for i, (k, _) in enumerate(arrays):
        np.testing.assert_array_equal(np.asarray(c.get(i)[0]), np.asarray(k)[:, :, want])
