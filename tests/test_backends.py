"""MLX, ONNX Runtime and PyTorch backends agree with Hugging Face and with each other;
cache trimming, forking, row selection, layer ranges and explicit positions/masks behave."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from runtime.backends import load_model

# max |Δlogit| allowed against Hugging Face transformers in float32, logits of magnitude ~10
TORCH_TOL = 1e-4
MLX_TOL = 2e-4
ONNX_TOL = 2e-4


def incremental(model, ids, splits):
    """Logits of `ids` fed in chunks through one cache."""
    cache = model.new_cache(ids.shape[0])
    out, start = [], 0
    for end in [*splits, ids.shape[1]]:
        out.append(model.forward(ids[:, start:end], cache))
        start = end
    return np.concatenate(out, 1), cache


@pytest.mark.parametrize(
    "backend,tol", [("torch", TORCH_TOL), ("mlx", MLX_TOL), ("onnx", ONNX_TOL)]
)
def test_backend_matches_hf(tiny_dir, arch, backend, tol):
    d = tiny_dir(arch)
    ids = np.random.default_rng(1).integers(0, 320, (2, 14))
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(d).eval()(torch.from_numpy(ids)).logits.numpy()
    got, cache = incremental(load_model(d, backend), ids, [8, 9, 10])
    assert cache.offset == 14
    assert np.abs(got - ref).max() < tol
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("backend", ["torch", "mlx", "onnx"])
def test_trim_equals_never_run(tiny_dir, backend):
    m = load_model(tiny_dir("qwen3"), backend)
    ids = np.random.default_rng(2).integers(0, 320, (1, 12))
    clean, _ = incremental(m, ids, [8])
    cache = m.new_cache()
    m.forward(ids[:, :8], cache)
    m.forward(np.array([[3, 1, 4, 1, 5]]), cache)  # rejected tokens
    assert cache.trim(5) == 5 and cache.offset == 8
    again = m.forward(ids[:, 8:], cache)
    np.testing.assert_array_equal(
        again, clean[:, 8:]
    ) if backend != "mlx" else np.testing.assert_allclose(again, clean[:, 8:], atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "mlx", "onnx"])
def test_fork_and_select_rows_keep_logits(tiny_dir, backend):
    m = load_model(tiny_dir("llama"), backend)
    ids = np.random.default_rng(3).integers(0, 320, (2, 10))
    full, _ = incremental(m, ids, [6])
    cache = m.new_cache(2)
    m.forward(ids[:, :6], cache)
    cache.select([1, 0, 1])  # reorder and fork
    assert cache.batch == 3
    got = m.forward(ids[[1, 0, 1], 6:], cache)
    np.testing.assert_allclose(got, full[[1, 0, 1], 6:], atol=1e-5)
    cache.select([2])  # commit one branch
    assert cache.batch == 1 and cache.offset == 10


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_layer_range_and_head(tiny_dir, backend):
    m = load_model(tiny_dir("qwen3"), backend)
    ids = np.random.default_rng(4).integers(0, 320, (1, 9))
    full = m.forward(ids, m.new_cache())
    cache = m.new_cache()
    h = m.forward_layers(ids, cache, 0, 2)
    early = m.head(h)  # early-exit logits: a different distribution than the full model's
    h = m.forward_layers(h, cache, 2, m.config.num_layers)
    np.testing.assert_allclose(m.head(h), full, atol=1e-5)
    assert early.shape == full.shape and np.abs(early - full).max() > 1e-2
    assert cache.offset == 9


def test_explicit_positions_and_mask_match_torch(tiny_dir):
    """A tree-shaped batch: two siblings at the same position, each seeing only its parent."""
    d = tiny_dir("qwen2")
    ids = np.random.default_rng(5).integers(0, 320, (1, 6))
    new = np.array([[7, 9]])
    pos = np.array([[6, 6]])  # siblings share a depth
    mask = np.ones((1, 2, 8), bool)
    mask[0, 0, 7] = mask[0, 1, 6] = False  # neither sees the other
    outs = []
    for backend in ("torch", "mlx"):
        m = load_model(d, backend)
        c = m.new_cache()
        m.forward(ids, c)
        outs.append(m.forward(new, c, positions=pos, mask=mask))
        # each sibling equals feeding it alone after the prefix
        for j in range(2):
            c2 = m.new_cache()
            m.forward(ids, c2)
            np.testing.assert_allclose(
                outs[-1][:, j], m.forward(new[:, j : j + 1], c2)[:, 0], atol=1e-4
            )
    np.testing.assert_allclose(outs[0], outs[1], atol=MLX_TOL)


@pytest.mark.parametrize("backend", ["torch", "mlx", "onnx"])
def test_key_holes_and_keep_columns(tiny_dir, backend):
    """Rows that skip some cached keys (a Mirror-SD branch batch) equal the same tokens fed
    without the skipped ones; keep_columns then closes the holes for later passes."""
    m = load_model(tiny_dir("qwen3"), backend)
    ids = np.random.default_rng(6).integers(0, 320, (1, 8))
    c = m.new_cache()
    m.forward(ids, c)
    b = c.fork([0, 0])
    mask = np.ones((2, 1, 9), bool)
    mask[0, 0, 5:8] = False  # row 0: token 99 right after ids[:5], at position 5
    got = m.forward(np.array([[99], [98]]), b, positions=np.array([[5], [8]]), mask=mask)[:, -1]
    for row, prefix, tok in ((0, ids[:, :5], 99), (1, ids, 98)):
        ref = m.new_cache()
        m.forward(prefix, ref)
        want = m.forward(np.array([[tok]]), ref)[0, -1]
        np.testing.assert_allclose(got[row], want, atol=1e-4)
    b.select([0])
    b.keep_columns([*range(5), 8])
    assert b.offset == 6
    ref = m.new_cache()
    m.forward(np.concatenate([ids[:, :5], [[99]]], 1), ref)
    np.testing.assert_allclose(
        m.forward(np.array([[7]]), b)[0, -1], m.forward(np.array([[7]]), ref)[0, -1], atol=1e-4
    )


def test_onnx_takes_key_holes_but_not_tree_masks(tiny_dir):
    from runtime.errors import DuetError

    m = load_model(tiny_dir("qwen3"), "onnx")
    c = m.new_cache()
    m.forward(np.array([[1, 2, 3]]), c)
    tree = np.ones((1, 2, 5), bool)
    tree[0, 1, 3] = False  # the second new token may not see the first: not causal-minus-keys
    with pytest.raises(DuetError, match="per-row key holes"):
        m.forward(np.array([[4, 5]]), c, mask=tree)


def test_onnx_rejects_layer_range(tiny_dir):
    from runtime.errors import DuetError

    m = load_model(tiny_dir("qwen3"), "onnx")
    with pytest.raises(DuetError, match="whole models"):
        m.forward_layers(np.array([[1]]), m.new_cache(), 0, 1)


def test_static_onnx_export_loads_as_a_draft(tiny_dir, tmp_path):
    """A fixed-shape (NPU) export is routed to its own host by load_model and agrees with torch."""
    from converters.__main__ import main

    d = tiny_dir("qwen3")
    out = tmp_path / "static.onnx"
    assert (
        main(
            [
                "export",
                "--model",
                str(d),
                "--format",
                "onnx",
                "--static-shapes",
                "--max-context",
                "64",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    m = load_model(out)
    ids = np.random.default_rng(6).integers(0, 320, (1, 7))
    got, _ = incremental(m, ids, [5])
    ref, _ = incremental(load_model(d, "torch"), ids, [5])
    assert np.abs(got - ref).max() < ONNX_TOL
