"""The target on ONNX Runtime (runtime/backends/onnx/target.py): float32 graphs equal the PyTorch
reference within TOL per family, with causal, tree and branch-row masks and over layer ranges;
an int4 target's greedy sd, tree and mirror equal its own ar; rollback after a rejection equals a
fresh prefill; the export is cached beside the checkpoint, keyed by quantization, and reused;
the command line runs it."""

import json
from pathlib import Path

import numpy as np
import pytest

from runtime.backends import load_model
from runtime.backends.onnx.target import OnnxTargetLM, part_path
from runtime.decoding import Sampling, make_steps, run
from runtime.errors import DuetError

TOL = 1e-4  # max |Δlogit| of the float32 graph against the PyTorch reference (logits ~ ±10)
PROMPT = [11, 42, 7, 99, 5, 250, 3, 17]


def _pair(tiny_dir, arch, quantize="none"):
    d = tiny_dir(arch, tie_word_embeddings=arch == "llama")
    return OnnxTargetLM(d, quantize, intra_threads=1), load_model(d, "torch", threads=1)


def _close(a, b):
    assert np.abs(np.asarray(a) - np.asarray(b)).max() < TOL


def test_float32_logits_equal_the_reference(tiny_dir, arch):
    onnx_lm, ref = _pair(tiny_dir, arch)
    co, cr = onnx_lm.new_cache(), ref.new_cache()
    ids = np.array([PROMPT])
    _close(onnx_lm.forward(ids[:, :5], co), ref.forward(ids[:, :5], cr))  # prefill
    _close(onnx_lm.forward(ids[:, 5:6], co), ref.forward(ids[:, 5:6], cr))  # one token
    _close(onnx_lm.forward(ids[:, 6:], co), ref.forward(ids[:, 6:], cr))  # a window
    # a layer range, the head on its hidden state, then the rest (Mirror-SD's early exit)
    n = ref.config.num_layers
    ho, hr = onnx_lm.forward_layers(ids[:, :2], co, 0, 1), ref.forward_layers(ids[:, :2], cr, 0, 1)
    _close(onnx_lm.head(ho), ref.head(hr))
    ho, hr = onnx_lm.forward_layers(ho, co, 1, n), ref.forward_layers(hr, cr, 1, n)
    _close(onnx_lm.head(ho), ref.head(hr))
    assert co.offset == cr.offset == len(PROMPT) + 2


def test_tree_mask_and_branch_rows_equal_the_reference(tiny_dir):
    onnx_lm, ref = _pair(tiny_dir, "qwen2")
    co, cr = onnx_lm.new_cache(), ref.new_cache()
    onnx_lm.forward(np.array([PROMPT]), co), ref.forward(np.array([PROMPT]), cr)
    P = len(PROMPT)
    # a tree: root 0, children 1 and 2 of 0, 3 child of 1; positions are depths
    parent = [-1, 0, 0, 1]
    m = np.zeros((4, P + 4), bool)
    m[:, :P] = True
    for i, p in enumerate(parent):
        m[i, P + i] = True
        while p >= 0:
            m[i, P + p], p = True, parent[p]
    pos = np.array([[P, P + 1, P + 1, P + 2]])
    toks = np.array([[5, 9, 13, 21]])
    _close(
        onnx_lm.forward(toks, co, positions=pos, mask=m),
        ref.forward(toks, cr, positions=pos, mask=m),
    )
    # two branch rows, each hiding its own key (a hole), several tokens over a past
    co.select([0, 0]), cr.select([0, 0])
    B = np.broadcast_to(np.tril(np.ones((2, P + 6), bool), P + 4)[None], (2, 2, P + 6)).copy()
    B[0, :, P], B[1, :, P + 1] = False, False
    toks = np.array([[3, 4], [7, 8]])
    _close(onnx_lm.forward(toks, co, mask=B), ref.forward(toks, cr, mask=B))


def test_rollback_after_rejection_equals_a_fresh_prefill(tiny_dir):
    lm, _ = _pair(tiny_dir, "llama")
    c = lm.new_cache()
    lm.forward(np.array([PROMPT]), c)
    lm.forward(np.array([[1, 2, 3, 4]]), c)  # a window, then 3 of its 4 tokens rejected
    assert c.trim(3) == 3
    got = lm.forward(np.array([[60, 61]]), c)
    fresh = lm.forward(np.array([PROMPT + [1, 60, 61]]), lm.new_cache())
    _close(got, fresh[:, -2:])


def test_the_export_is_cached_per_quantization_and_reused(tiny_dir, monkeypatch):
    d = tiny_dir("qwen3", num_layers=2, seed=3)
    OnnxTargetLM(d, "none", intra_threads=1)
    OnnxTargetLM(d, "int8", intra_threads=1)
    full = part_path(d, "none", "full")
    assert full.is_file() and part_path(d, "int8", "full").is_file()
    stamp = full.stat().st_mtime_ns

    def no_export(*a, **k):
        raise AssertionError("exported again")

    monkeypatch.setattr("converters.onnx_target_export.export_target_part", no_export)
    lm = OnnxTargetLM(d, "none", intra_threads=1)
    assert full.stat().st_mtime_ns == stamp
    assert lm.quantization == {
        "scheme": "none",
        "present": "in-place",
        "head_rows": True,
        "parts": "residual carried apart",
    }
    q = OnnxTargetLM(d, "int8", intra_threads=1).quantization
    assert (q["op"], q["bits"], q["block_size"]) == ("MatMulNBits", 8, 32)


def matmul_model(K: int, N: int, rng):
    """An ONNX model of one MatMul node "mm", Y = A @ W (A: M x K), with W (K x N, drawn from
    `rng`) as its initializer; and W."""
    from onnx import TensorProto
    from onnx import helper as oh
    from onnx import numpy_helper as onh

    W = rng.standard_normal((K, N)).astype(np.float32)
    g = oh.make_graph(
        [oh.make_node("MatMul", ["A", "W"], ["Y"], name="mm")],
        "g",
        [oh.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [oh.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [onh.from_array(W, "W")],
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9), W


def run_model(m, A: np.ndarray) -> np.ndarray:
    """Y of `m` (matmul_model's graph, perhaps rewritten) on CPU for the input A."""
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": A})[0]


def test_int8_weights_as_two_4bit_halves_are_exact():
    """q8 = 16 hi + lo through two 4-bit MatMulNBits equals the int8-dequantized product (float
    compute, accuracy level 0: the same on every instruction set)."""
    from converters.onnx_head_split import split_matmul

    K, N = 96, 40
    rng = np.random.default_rng(0)
    m, W = matmul_model(K, N, rng)
    split_matmul(m, "mm", 32, accuracy_level=0)
    y = run_model(m, A := rng.standard_normal((3, K)).astype(np.float32))
    Wb = W.T.reshape(N, 3, 32)
    s = np.abs(Wb).max(-1, keepdims=True) / 119
    Wq = (np.rint(Wb / s) * s).reshape(N, K).T
    assert np.abs(y - A @ Wq).max() < 1e-4 < np.abs(y - A @ W).max()


@pytest.mark.parametrize("level", [0, 4])
def test_int8_weights_as_one_8bit_matmul_equal_their_int8_product(level):
    """One 8-bit MatMulNBits (converters/onnx_head_split.one_matmul8) equals the int8-dequantized
    product: at accuracy level 0 (float compute, any CPU) exactly up to float sums, at 4 (int8
    activations) within their rounding. Level 4 runs only where the recipe uses it (a VNNI
    CPU): without VNNI a pair of int8 products can clip, which is why the recipe keeps halves."""
    from converters.onnx_head_split import one_matmul8
    from runtime.backends.onnx.target import int8_dot

    if level == 4 and not int8_dot():
        pytest.skip("this CPU has no VNNI: the recipe writes 8-bit weights as two 4-bit halves")
    K, N = 96, 40
    rng = np.random.default_rng(0)
    m, W = matmul_model(K, N, rng)
    one_matmul8(m, "mm", 32, accuracy_level=level)
    assert [n.op_type for n in m.graph.node] == ["MatMulNBits"]
    A = rng.standard_normal((3, K)).astype(np.float32)
    y = run_model(m, A)
    Wb = W.T.reshape(N, 3, 32)
    s = np.abs(Wb).max(-1, keepdims=True) / 127
    Wq = (np.rint(Wb / s) * s).reshape(N, K).T
    if level == 4:  # the activations rounded to int8 per block of 32, as the kernel does
        Ab = A.reshape(3, 3, 32)
        sa = np.abs(Ab).max(-1, keepdims=True) / 127
        A = (np.rint(Ab / sa) * sa).reshape(3, K)
    assert np.abs(y - A @ Wq).max() < 1e-3
    assert np.abs(y - A @ W).max() > 1e-3  # the weights really were rounded to 8 bits


def _gen(method, target, draft, n=16, **kw):
    steps = make_steps(method, target, draft, PROMPT, max_new=n, sampling=Sampling(), seed=0, **kw)
    return run(steps, max_new=n, eos_ids=target.config.eos_token_ids).tokens


@pytest.mark.parametrize("attention", ["window", "rows"])
def test_int4_target_sd_tree_and_mirror_equal_its_own_ar(tiny_dir, attention, monkeypatch):
    monkeypatch.setattr("runtime.backends.onnx.target.ATTENTION", attention)
    d = tiny_dir("llama", tie_word_embeddings=True)
    target = OnnxTargetLM(d, "int4", intra_threads=1)
    q = target.quantization
    assert (q["accuracy_level"], q["head_accuracy_level"]) == (4, 4)
    assert q.get("attention", "window").startswith(attention)
    draft = load_model(tiny_dir("llama", num_layers=1, hidden_size=32, seed=7), "onnx")
    ref = _gen("ar", target, None)
    assert _gen("sd", target, draft, gamma=3) == ref
    assert _gen("tree", target, draft) == ref
    assert _gen("mirror", target, draft, gamma=3, exit_layer=2) == ref


@pytest.mark.parametrize("attention", ["window", "rows"])
def test_int4_windows_and_tree_rows_equal_one_token_passes_bit_for_bit(
    tiny_dir, arch, attention, monkeypatch
):
    """At int8 activations (accuracy level 4) a last-bit difference in attention grows through
    the layers (GroupQueryAttention's one-query path left SmolLM2 0.6-0.84 logits from its
    window path); with one-token passes padded to two ("window") or every token a row ("rows"),
    a verify window, a prefill with drafts and a tree's path give exactly ar's one-token logits
    and KV."""
    monkeypatch.setattr("runtime.backends.onnx.target.ATTENTION", attention)
    lm = OnnxTargetLM(tiny_dir(arch, tie_word_embeddings=arch == "llama"), "int4", 1)
    assert lm.quantization["accuracy_level"] == 4
    P, win = len(PROMPT), np.array([[5, 9, 13, 21, 30]])
    ca, cb = lm.new_cache(), lm.new_cache()
    lm.forward(np.array([PROMPT]), ca), lm.forward(np.array([PROMPT]), cb)
    got = lm.forward(win, ca)
    one = np.concatenate([lm.forward(win[:, i : i + 1], cb) for i in range(5)], axis=1)
    assert np.array_equal(got, one)
    for i in range(lm.config.num_layers):
        assert all(np.array_equal(a, b) for a, b in zip(ca.get(i), cb.get(i), strict=True))
    # sd's first pass: the prompt and the first drafts in one window; a long pass in chunks
    monkeypatch.setattr("runtime.backends.onnx.target_rows.ROW_KEYS", 40)  # 3 rows a run
    both = lm.forward(np.array([PROMPT + win[0].tolist()]), lm.new_cache())
    assert np.array_equal(both[:, P:], one)
    # a tree over the same past: 0 -> {1, 2}, 1 -> 3; the path 0, 1, 3 is what ar would run
    ca.trim(5), cb.trim(5)
    parent, m = [-1, 0, 0, 1], np.zeros((4, P + 4), bool)
    m[:, :P] = True
    for i, p in enumerate(parent):
        m[i, P + i] = True
        while p >= 0:
            m[i, P + p], p = True, parent[p]
    toks = np.array([[5, 9, 40, 13]])
    tree = lm.forward(toks, ca, positions=np.array([[P, P + 1, P + 1, P + 2]]), mask=m)
    path = np.concatenate([lm.forward(toks[:, [i]], cb) for i in (0, 1, 3)], axis=1)
    assert np.array_equal(tree[:, [0, 1, 3]], path)


def test_unsupported_family_and_quantization_are_one_line(tiny_dir):
    with pytest.raises(DuetError, match="--quantize"):
        OnnxTargetLM(tiny_dir("llama"), "int3")
    with pytest.raises(DuetError, match="target-backend torch"):
        OnnxTargetLM(tiny_dir("qwen3_5_text"), "none")


def test_generate_cli_runs_the_onnx_target(tiny_dir, capsys):
    from runtime.generate import main

    d = tiny_dir("qwen3", num_layers=2, seed=3)
    args = ["--target", str(d), "--target-backend", "onnx", "--quantize", "int4",
            "--prompt-ids", "1,2,3", "--max-tokens", "6", "--json"]  # fmt: skip
    assert main([*args, "--method", "ar"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"]) == 6


def test_converters_export_role_target_seeds_the_cache(tiny_dir, tmp_path, capsys):
    from converters.__main__ import main

    d = tiny_dir("qwen2", num_layers=2, seed=5)
    out = d / ".duet"
    args = ["export", "--role", "target", "--model", str(d), "--format", "onnx",
            "--quantize", "none", "--exit-layer", "1", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert "max |Δlogit|" in capsys.readouterr().out
    for name in ("full", "layers.0.1", "layers.1.2", "head"):
        assert part_path(d, "none", name).is_file(), name
    assert main([*args[:5], "--format", "coreml", *args[7:]]) == 2  # one line, not a traceback
    assert "--format onnx" in capsys.readouterr().err


def test_weights_on_a_q4_1_grid_are_kept_exactly():
    """A weight whose blocks are d q + m (a Q4_1 GGUF's) runs exactly, not requantized
    (float compute, accuracy level 0); one off the grid is left alone. Its block sums come from
    indicator columns of the same MatMulNBits."""
    import onnxruntime as ort
    from onnx import TensorProto
    from onnx import helper as oh
    from onnx import numpy_helper as onh

    from converters.onnx_grid_q4 import keep_grids

    K, N = 64, 24
    rng = np.random.default_rng(1)
    d, m = rng.uniform(0.01, 0.1, (N, 2, 1)), rng.uniform(-1, 0, (N, 2, 1))
    q = rng.integers(0, 16, (N, 2, 32))
    q[..., 0], q[..., 1] = 0, 15  # each block spans its grid
    W = (d * q + m).reshape(N, K).T.astype(np.float32)
    off = rng.standard_normal((K, N)).astype(np.float32)
    nodes = [oh.make_node("MatMul", ["A", "W"], ["Y"], name="on"),
             oh.make_node("MatMul", ["A", "V"], ["Z"], name="off")]  # fmt: skip
    g = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("A", TensorProto.FLOAT, [1, 3, K])],
        [oh.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "YZ"],
        [onh.from_array(W, "W"), onh.from_array(off, "V")],
    )
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)
    assert keep_grids(model, 32, 0, set()) == ["on.grid_min"]
    A = rng.standard_normal((1, 3, K)).astype(np.float32)
    y, z = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"A": A}
    )
    assert np.abs(y - A @ W).max() < 1e-4 and np.abs(z - A @ off).max() < 1e-4
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 1 and "ReduceSum" not in ops
    nbits = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    assert next(a.i for a in nbits.attribute if a.name == "N") == N + 2  # K / 32 sums


def _on_q4_1_grid(src, dst):
    """A copy of checkpoint `src` whose linear weights lie on a Q4_1 grid (each block of 32 input
    channels d q + m, as a checkpoint dequantized from a Q4_1 GGUF holds them)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".duet"))
    f = next(Path(dst).glob("*.safetensors"))
    state = load_file(f)
    for k, w in state.items():
        if k.endswith("_proj.weight"):
            b = w.float().reshape(w.shape[0], -1, 32)
            lo, hi = b.min(-1, keepdim=True).values, b.max(-1, keepdim=True).values
            d = (hi - lo) / 15
            state[k] = (lo + d * torch.round((b - lo) / d)).reshape(w.shape).to(w.dtype)
    save_file(state, f)
    return Path(dst)


def test_a_q4_1_grid_checkpoint_keeps_its_blocks_and_stays_exact(tiny_dir, tmp_path):
    """The GGUF path: every layer weight kept on its grid with fused block sums, and at int8
    activations a verify window and sd give exactly ar's one-token logits and tokens."""
    import onnx

    d = _on_q4_1_grid(tiny_dir("llama", tie_word_embeddings=True), tmp_path / "grid")
    lm = OnnxTargetLM(d, "int4", 1)
    assert lm.quantization["grid_sums"] == "fused columns"
    nodes = onnx.load(str(next((d / ".duet").glob("*-full.onnx")))).graph.node
    assert sum(n.name.endswith(".sums") for n in nodes) == 4 * lm.config.num_layers
    assert not any(n.op_type == "ReduceSum" for n in nodes)
    win = np.array([[5, 9, 13, 21, 30]])
    ca, cb = lm.new_cache(), lm.new_cache()
    lm.forward(np.array([PROMPT]), ca), lm.forward(np.array([PROMPT]), cb)
    one = np.concatenate([lm.forward(win[:, i : i + 1], cb) for i in range(5)], axis=1)
    assert np.array_equal(lm.forward(win, ca), one)
    draft = load_model(tiny_dir("llama", num_layers=1, hidden_size=32, seed=7), "onnx")
    assert _gen("sd", lm, draft, gamma=3) == _gen("ar", lm, None)


def test_agree_and_pass_cost_commands(tiny_dir, tmp_path, capsys):
    """`python -m converters.onnx_target_cli agree` (a float32 graph agrees with its reference
    everywhere) and `pass-cost` (a 1- and a 3-token pass, timed)."""
    from converters.onnx_target_cli import main

    d = tiny_dir("qwen2", num_layers=2, seed=5)
    text = tmp_path / "held.jsonl"
    text.write_text(json.dumps({"turns": ["a held-out text of some length, " * 4]}) + "\n")
    assert (
        main(
            [
                "agree",
                "--model",
                str(d),
                "--quantize",
                "none",
                "--text",
                str(text),
                "--threads",
                "1",
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["agreement"] == 1.0 and r["positions"] > 100
    assert (
        main(
            [
                "pass-cost",
                "--model",
                str(d),
                "--quantize",
                "int4",
                "--context",
                "20",
                "--windows",
                "1,3",
                "--repeats",
                "2",
                "--threads",
                "1",
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert set(r["seconds"]) == {"1", "3"} and r["ratio"]["1"] == 1.0
    assert main(["agree", "--model", str(d), "--text", str(tmp_path / "none.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert (
        main(["agree", "--model", str(d), "--text", str(text), "--ort-genai", str(tmp_path)]) == 2
    )
    assert "not an onnxruntime-genai model folder" in capsys.readouterr().err


def test_q4_k_blocks_whose_levels_skip_the_ends_are_kept():
    """A Q4_K sub-block's levels need not reach 0 and 15: its step comes from the gaps."""
    from converters.onnx_grid_q4 import grid_of

    K, N = 64, 8
    rng = np.random.default_rng(2)
    d, m = rng.uniform(0.01, 0.1, (N, 2, 1)), rng.uniform(-1, 0, (N, 2, 1))
    q = rng.integers(2, 13, (N, 2, 32))
    q[..., 0], q[..., 1], q[..., 2] = 2, 3, 12  # a gap of one level in every block
    W = (d * q + m).reshape(N, K).T.astype(np.float32)
    got = grid_of(W, 32)
    assert got is not None
    gq, gd, gm = got
    back = (gm[..., None] + gd[..., None] * gq).reshape(N, K).T
    assert np.abs(back - W).max() < 1e-6 and gq.max() <= 15
    assert grid_of(rng.standard_normal((K, N)).astype(np.float32), 32) is None


def test_int4_from_a_gguf_keeps_weights_finer_than_4_bits_at_8(tiny_dir, tmp_path):
    """A checkpoint dequantized from a GGUF: a weight off every 4-bit grid was stored at 5-8
    bits there and stays at 8 bits (two 4-bit halves, or one 8-bit MatMulNBits on a VNNI CPU);
    without a GGUF source it is 4-bit."""
    import shutil

    import onnx

    from converters.onnx_target_export import export_target_part

    src = tiny_dir("qwen2", num_layers=2, seed=5)
    d = tmp_path / "from-gguf"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns(".duet"))
    (d / "duet-source.json").write_text(json.dumps({"gguf": "model.Q4_K_M.gguf"}))

    def widths(model_dir, out):  # (8-bit weights, 4-bit weights)
        export_target_part(model_dir, out, 0, 2, True, "int4")
        nodes = [n for n in onnx.load(str(out)).graph.node if n.op_type == "MatMulNBits"]
        bits = [next(a.i for a in n.attribute if a.name == "bits") for n in nodes]
        eight = sum(b == 8 or n.name.endswith(".hi") for n, b in zip(nodes, bits, strict=True))
        return eight, sum(
            b == 4 and not n.name.endswith((".hi", ".lo")) for n, b in zip(nodes, bits, strict=True)
        )

    assert widths(d, tmp_path / "g.onnx") == (2 * 4 + 1, 0)  # 4 a layer + head
    assert widths(src, tmp_path / "p.onnx") == (1, 2 * 4)  # the head alone


def test_a_padded_one_token_pass_keeps_one_column_and_its_own_logits(tiny_dir):
    """A one-token pass runs as two rows (PAD_ONE_TOKEN); the second leaves nothing behind:
    the cache grows by one, and the next pass overwrites the stale column."""
    lm = OnnxTargetLM(tiny_dir("qwen2"), "int4", intra_threads=1)
    c = lm.new_cache()
    lm.forward(np.array([PROMPT[:4]]), c)
    one = lm.forward(np.array([PROMPT[4:5]]), c)
    assert one.shape == (1, 1, lm.config.vocab_size) and c.offset == 5
    h = lm.forward_layers(np.array([PROMPT[5:6]]), c, 0, lm.config.num_layers)
    assert h.shape == (1, 1, lm.config.hidden_size) and c.offset == 6
    fresh = lm.new_cache()
    want = lm.forward(np.array([PROMPT[:5]]), fresh)[:, -1:]  # row 4 of a 5-token prefill
    np.testing.assert_array_equal(one, want)


def test_the_head_on_the_last_rows_equals_those_rows_of_a_full_pass(tiny_dir):
    lm = OnnxTargetLM(tiny_dir("llama", tie_word_embeddings=True), "int4", intra_threads=1)
    ids = np.array([PROMPT])
    full, cut = lm.new_cache(), lm.new_cache()
    want = lm.forward(ids, full)
    got = lm.forward(ids, cut, last=3)
    assert got.shape == (1, 3, lm.config.vocab_size)
    np.testing.assert_array_equal(got, want[:, -3:])
    assert cut.offset == full.offset == len(PROMPT)  # every row's keys are kept
    np.testing.assert_array_equal(cut.get(0)[0], full.get(0)[0])


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_int4_parts_give_the_whole_graphs_logits_bit_for_bit(tiny_dir, arch):
    """Mirror-SD's early exit and a fitted head's taps run the target as layer-range parts: at
    int8 activations they give the whole graph's logits exactly (the residual stream crosses a
    part boundary as two halves, added by the next part's norm as the whole graph adds them)."""
    lm = OnnxTargetLM(tiny_dir(arch, num_layers=4, seed=11), "int4", 1)
    ids = np.array([PROMPT * 6])
    whole = lm.forward(ids, lm.new_cache())
    for cut in (1, 2, 3):
        c = lm.new_cache()
        h = lm.forward_layers(lm.forward_layers(ids, c, 0, cut), c, cut, 4)
        assert np.array_equal(lm.head(h), whole), cut


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_the_whole_graph_gives_a_heads_taps_as_the_parts_do(tiny_dir, arch):
    """A fitted head's taps are the whole graph's third output (`full.taps.*`): bit for bit
    the layer outputs the layer-range parts give (their two halves added), beside the plain
    graph's logits; a prefill and then a one-token pass (padded to two rows inside)."""
    lm = OnnxTargetLM(tiny_dir(arch, num_layers=4, seed=11), "int4", 1)
    ids, taps = np.array([PROMPT * 6]), (0, 2, 3)
    c_whole, c_taps, c_parts = lm.new_cache(), lm.new_cache(), lm.new_cache()
    for x in (ids, ids[:, -1:]):
        whole = lm.forward(x, c_whole)
        logits, _h, got = lm._run(x, c_taps, 0, 4, True, None, None, None, taps)
        assert np.array_equal(logits, whole)
        assert got.shape == (1, x.shape[1], 3 * lm.config.hidden_size)
        h, want = x, {}
        for a in range(4):
            h = lm.forward_layers(h, c_parts, a, a + 1)
            want[a] = h.sum()
        assert np.array_equal(got, np.concatenate([want[i] for i in taps], axis=-1))


def test_the_one_row_kernel_is_told_per_cpu(monkeypatch):
    """ONE_ROW (runtime/backends/onnx/target.py): x86-64 without VNNI sums a one-row MatMulNBits
    apart, so a one-row head widens to two rows there (the row before, or a padded pass's
    second); VNNI and arm64 keep their path."""
    from runtime.backends.onnx.cpu_int8 import int8_path_from_flags
    from runtime.backends.onnx.residual import head_span

    assert int8_path_from_flags("x86_64", {"avx2"}).one_row_kernel
    assert not int8_path_from_flags("x86_64", {"avx2", "avx512_vnni"}).one_row_kernel
    assert not int8_path_from_flags("aarch64", set()).one_row_kernel
    for apart in (False, True):
        monkeypatch.setattr("runtime.backends.onnx.residual.one_row_apart", lambda a=apart: a)
        assert head_span(0, 1, 2) == ((0, 2) if apart else (0, 1))
        assert head_span(4, 5, 5) == ((3, 5) if apart else (4, 5))
        assert head_span(0, 5, 5) == (0, 5) and head_span(3, 3, 5) == (3, 3)


@pytest.mark.parametrize("attention", ["window", "rows"])
def test_one_row_passes_padded_give_a_windows_rows_bit_for_bit(tiny_dir, attention, monkeypatch):
    """ONE_ROW's padding forced on, whatever this CPU (it is the path of x86-64 without VNNI): a
    one-token pass, a prefill's last row (last=1) and a lone Residual's head (Mirror-SD's parts)
    each give exactly that row of a whole prefill's logits, and the cache keeps one column."""
    monkeypatch.setattr("runtime.backends.onnx.target.ATTENTION", attention)
    for mod in ("residual", "target"):
        monkeypatch.setattr(f"runtime.backends.onnx.{mod}.one_row_apart", lambda: True)
    lm = OnnxTargetLM(tiny_dir("qwen3"), "int4", intra_threads=1)
    ids, n = np.array([PROMPT]), lm.config.num_layers
    want = lm.forward(ids, lm.new_cache())[:, -1:]
    c = lm.new_cache()
    lm.forward(ids[:, :-1], c)
    assert np.array_equal(lm.forward(ids[:, -1:], c), want) and c.offset == len(PROMPT)
    assert np.array_equal(lm.forward(ids, lm.new_cache(), last=1), want)
    c = lm.new_cache()
    lm.forward_layers(ids[:, :-1], c, 0, n)
    assert np.array_equal(lm.head(lm.forward_layers(ids[:, -1:], c, 0, n)), want)
