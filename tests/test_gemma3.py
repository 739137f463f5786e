"""Gemma 3 (`gemma3_text`, and the text tower of `gemma3`): config fields; the torch reference
equals Hugging Face (logits and greedy generate, prompts longer than the sliding window);
local layers keep only their window and slack, and rollback lands exactly on the accepted
prefix; every method is lossless; MLX and ONNX Runtime agree with the reference."""

import numpy as np
import pytest
import torch
from edge_helpers import flexspec
from test_hybrid import hf_model, near_copy  # the target with 2 % noise: some drafts rejected

import runtime.caches.sliding as sliding_cache
from runtime.backends import load_model
from runtime.config import ModelConfig
from runtime.decoding import Sampling, make_steps, run
from runtime.errors import DuetError

WINDOW = 8  # the tiny checkpoints' sliding window
SLACK = 12  # lowered from 64 so that short tests drop keys (covers γ ≤ 5, trees of depth 5)
PROMPT = [int(t) for t in np.random.default_rng(1).integers(0, 320, 24)]  # > window + slack
N = 40
TOL = 2e-4


@pytest.fixture(autouse=True)
def small_slack(monkeypatch):
    monkeypatch.setattr(sliding_cache, "SLACK", SLACK)


@pytest.fixture(scope="module")
def gemma(tiny_dir):
    return tiny_dir("gemma3_text", num_layers=4)  # untied: a tied random one repeats a token


def hf_greedy(path, prompt, n):
    with torch.no_grad():
        out = hf_model(path).generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n
        )
    return out[0, len(prompt) :].tolist()


def prefill_then_steps(m, ids: np.ndarray, cache) -> np.ndarray:
    """`m`'s logits over ids (B, 30) into `cache`: a 20-token prefill, then ten single steps."""
    out = [m.forward(ids[:, :20], cache)]
    out += [m.forward(ids[:, t : t + 1], cache) for t in range(20, 30)]
    return np.concatenate(out, axis=1)


def gen(method, target, draft, prompt=PROMPT, n=N, **kw):
    steps = make_steps(method, target, draft, prompt, max_new=n, sampling=Sampling(), seed=0, **kw)
    return run(steps, max_new=n)


def test_config_reads_gemma_fields_and_is_not_hybrid(gemma):
    c = ModelConfig.from_dir(gemma)
    assert c.model_type == "gemma3_text" and not c.is_hybrid and c.layer_types == ()
    assert c.sliding == (True, True, False, True) and c.sliding_window == WINDOW
    assert (c.rope_local_theta, c.rope_theta) == (10_000.0, 1_000_000.0)
    assert c.query_pre_attn_scalar == 2 * c.head_dim and c.qk_norm
    assert c.hidden_activation == "gelu_pytorch_tanh" and c.final_logit_softcapping == 0.0
    old = ModelConfig.from_dict(
        {
            "model_type": "gemma3_text",
            "num_hidden_layers": 7,
            "sliding_window_pattern": 3,
            "rope_theta": 5e5,
            "rope_local_base_freq": 2e4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        }
    )
    assert old.sliding == (True, True, False, True, True, False, True)
    assert (old.rope_local_theta, old.rope_theta) == (2e4, 5e5)
    assert old.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert old.tie_word_embeddings and old.vocab_size == 262_208  # Gemma3TextConfig defaults
    with pytest.raises(DuetError, match="bidirectional"):
        ModelConfig.from_dict({"model_type": "gemma3_text", "use_bidirectional_attention": True})
    llama = ModelConfig.from_dict(
        {
            "model_type": "llama",
            "vocab_size": 8,
            "hidden_size": 8,
            "intermediate_size": 8,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
        }
    )
    assert llama.sliding == () and llama.sliding_window == 0


@pytest.mark.parametrize("variant", ["tied", "softcap_untied"])
def test_torch_reference_equals_hugging_face(tiny_dir, variant):
    kw = {"softcap": 3.0, "tie_word_embeddings": False} if variant != "tied" else {}
    d = tiny_dir("gemma3_text", num_layers=4, **{"tie_word_embeddings": True, **kw})
    ids = np.random.default_rng(0).integers(0, 320, (2, 30))
    with torch.no_grad():
        ref = hf_model(d)(torch.from_numpy(ids)).logits.numpy()
    m = load_model(d, "torch", threads=1)
    c = m.new_cache(batch=2)
    ours = prefill_then_steps(m, ids, c)
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)
    for i, s in enumerate(ModelConfig.from_dir(d).sliding):  # local layers dropped old keys
        assert c.held(i) == (WINDOW + SLACK if s else 30)
    assert gen("ar", m, None).tokens == hf_greedy(d, PROMPT, N)


def test_multimodal_gemma3_runs_its_text_tower(tiny_dir, capfd):
    mm = tiny_dir("gemma3", num_layers=4, tie_word_embeddings=True)
    c = ModelConfig.from_dir(mm)
    assert c.model_type == "gemma3_text" and c.sliding == (True, True, False, True)
    m = load_model(mm, "torch", threads=1)
    assert "ignoring 2 vision weights" in capfd.readouterr().err
    text = load_model(tiny_dir("gemma3_text", num_layers=4, tie_word_embeddings=True), "torch")
    assert gen("ar", m, None).tokens == gen("ar", text, None).tokens


def test_rollback_after_rejection_equals_a_fresh_prefill(gemma):
    """Prefill, feed a window of 6 drafts past the slack's reach of old keys, keep 2 of them:
    the next token's logits and every layer's held keys equal a fresh prefill's."""
    m = load_model(gemma, "torch", threads=1)
    seq = PROMPT + [5, 6, 7, 8, 9, 10]
    c = m.new_cache()
    m.forward(np.array([PROMPT]), c)
    for t in range(3):  # some decode steps so that keys get dropped
        m.forward(np.array([[seq[24 + t]]]), c)
    m.forward(np.array([seq[27:30] + [1, 2, 3]]), c)  # a verify window: 3 right, 3 wrong
    assert c.trim(3) == 3 and c.offset == 30 and c.resets == 0
    got = m.forward(np.array([[4]]), c)[0, -1]
    fresh = m.new_cache()
    want = m.forward(np.array([seq + [4]]), fresh)[0, -1]
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    for i in range(4):
        n = min(c.held(i), fresh.held(i))
        for a, b in zip(c.get(i), fresh.get(i), strict=True):  # keys, values (and positions)
            a, b = (x[..., -n:, :] if x.ndim == 4 else x[:, -n:] for x in (a, b))
            np.testing.assert_allclose(a, b, atol=TOL)
    assert c.trim(20) == 31 and c.offset == 0 and c.resets == 1  # behind the slack: emptied


def test_a_rewind_behind_the_slack_feeds_the_sequence_again(gemma):
    """A chat turn that rewinds its caches to an earlier prefix than the local layers still
    hold: the cache empties and the next answer equals one from a fresh cache."""
    from runtime.decoding.events import rewind

    m = load_model(gemma, "torch", threads=1)
    c = m.new_cache()
    gen("ar", m, None, target_cache=c)
    rewind(c, 5)
    assert c.offset == 0 and c.resets == 1
    turn = PROMPT[:5] + [9, 8, 7]
    assert (
        gen("ar", m, None, prompt=turn, target_cache=c).tokens
        == gen("ar", m, None, prompt=turn).tokens
    )


def test_tree_compact_and_branch_rows_keep_the_window_by_position(gemma):
    """A tree window (columns are not positions) committed by compact, and branch rows forked,
    selected and closed by keep_columns, give the logits of the plain causal sequence."""
    m = load_model(gemma, "torch", threads=1)
    c = m.new_cache()
    m.forward(np.array([PROMPT]), c)
    o = c.offset
    # tree: root 0 with children 1, 2; node 3 under 2 (positions o, o+1, o+1, o+2)
    pos = np.array([[o, o + 1, o + 1, o + 2]])
    mask = np.ones((1, 4, o + 4), bool)
    mask[0, :, o:] = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]
    tree = m.forward(np.array([[50, 60, 70, 80]]), c, positions=pos, mask=mask)[0]
    c.compact(o, [o, o + 2, o + 3])
    nxt = m.forward(np.array([[90]]), c)[0, -1]
    plain = m.forward(np.array([PROMPT + [50, 70, 80, 90]]), m.new_cache())[0]
    np.testing.assert_allclose(tree[[0, 2, 3]], plain[o : o + 3], atol=TOL)
    np.testing.assert_allclose(nxt, plain[-1], atol=TOL)
    # branch rows: row 0 continues the prefix; row 1 replaces its last token (90), so the
    # prefix's last column is a hole in row 1 and its positions run one behind its columns
    b = c.fork([0, 0])
    base = b.offset
    for k in range(2):
        mk = np.ones((2, 1, base + k + 1), bool)
        mk[1, :, base - 1] = False
        pos = np.array([[base + k], [base - 1 + k]])
        out = m.forward(np.array([[100 + 2 * k], [101 + 2 * k]]), b, mask=mk, positions=pos)
    b.select([1])
    b.keep_columns([*range(base - 1), base, base + 1])
    seq = PROMPT + [50, 70, 80, 101, 103]
    want = m.forward(np.array([seq + [7]]), m.new_cache())[0]
    np.testing.assert_allclose(out[1, -1], want[-2], atol=TOL)
    np.testing.assert_allclose(m.forward(np.array([[7]]), b)[0, -1], want[-1], atol=TOL)
    assert b.offset == len(seq) + 1 and b.resets == 0


@pytest.mark.parametrize("method", ["sd", "tree", "heterospec", "mirror"])
def test_every_method_is_lossless(gemma, tiny_dir, method):
    target = load_model(gemma, "torch", threads=1)
    ref = gen("ar", target, None).tokens
    weak = load_model(tiny_dir("gemma3_text", num_layers=1, hidden_size=32, seed=7), "torch")
    for draft in (near_copy(gemma), weak):
        tc, dc = target.new_cache(), draft.new_cache()
        r = gen(method, target, draft, target_cache=tc, draft_cache=dc)
        assert r.tokens == ref, (method, r.stats.accept_lengths)
        assert tc.resets == dc.resets == 0 and tc.held(0) <= WINDOW + SLACK + 6


def test_flexspec_is_lossless(gemma, verifier):
    from runtime.edge.client import Connection

    target = load_model(gemma, "torch", threads=1)
    ref = gen("ar", target, None).tokens
    st = verifier(target)
    conn = Connection(st.host, st.port)
    r = flexspec(conn, near_copy(gemma), PROMPT, N, k=4)
    conn.close()
    assert r.tokens == ref and min(r.stats.accept_lengths) < 5


def variant_dir(tiny_dir, variant):
    kw = {"softcap": 3.0} if variant == "softcap_untied" else {"tie_word_embeddings": True}
    return tiny_dir("gemma3_text", num_layers=4, **kw)


@pytest.mark.parametrize("variant", ["tied", "softcap_untied"])
@pytest.mark.parametrize("backend", ["mlx", "onnx"])
def test_backend_equals_the_torch_reference(tiny_dir, backend, variant):
    """MLX and the ONNX export compute the reference's logits over a prefill and ten single
    steps, their local layers holding only window + slack."""
    d = variant_dir(tiny_dir, variant)
    ids = np.random.default_rng(0).integers(0, 320, (2, 30))
    ref = load_model(d, "torch", threads=1)
    want = ref.forward(ids, ref.new_cache(batch=2))
    m = load_model(d, backend)
    c = m.new_cache(batch=2)
    np.testing.assert_allclose(prefill_then_steps(m, ids, c), want, atol=TOL, rtol=0)
    assert [c.held(i) for i in range(4)] == [WINDOW + SLACK] * 2 + [30, WINDOW + SLACK]
    if backend == "mlx":
        assert gen("ar", m, None).tokens == gen("ar", ref, None).tokens


def test_methods_on_an_mlx_target_are_lossless(gemma, tiny_dir):
    target = load_model(gemma, "mlx")
    ref = gen("ar", target, None).tokens
    weak = load_model(tiny_dir("gemma3_text", num_layers=1, hidden_size=32, seed=7), "mlx")
    for draft in (near_copy(gemma), weak):
        for method in ("sd", "tree", "mirror"):
            assert gen(method, target, draft).tokens == ref, method


def test_onnx_drafts_are_lossless(gemma, tiny_dir):
    """ONNX drafts (its own export: all accepted; a weak one: rolled back every step) under
    sd, tree and mirror (branch rows with key holes in the draft's cache)."""
    target = load_model(gemma, "torch", threads=1)
    ref = gen("ar", target, None).tokens
    weak = tiny_dir("gemma3_text", num_layers=1, hidden_size=32, seed=7)
    for draft in (load_model(gemma, "onnx"), load_model(weak, "onnx")):
        for method in ("sd", "tree", "mirror"):
            assert gen(method, target, draft).tokens == ref, method


def test_static_onnx_export_refuses_in_one_line(gemma, tmp_path):
    from converters.onnx_static_build import build_static_onnx

    with pytest.raises(DuetError, match="not built for sliding-window models"):
        build_static_onnx(gemma, tmp_path / "x.onnx")


def test_a_mirror_wave_wider_than_the_slack_grows_it(gemma, tiny_dir):
    """γ = 8: a wave's rows reach ~2γ = 16 positions back, past the base slack of 12; the
    cache widens its slack from the spread it sees (it raised a DuetError without that)."""
    target = load_model(gemma, "torch", threads=1)
    weak = load_model(tiny_dir("gemma3_text", num_layers=1, hidden_size=32, seed=7), "torch")
    dc = weak.new_cache()
    assert (
        gen("mirror", target, weak, gamma=8, draft_cache=dc).tokens
        == gen("ar", target, None).tokens
    )


def test_a_draft_of_global_layers_only_runs_on_onnx(gemma, tiny_dir, tmp_path):
    """A draft cut from a Gemma 3 target's global layers (`apps.train draft-tune
    --from-target-layers 5,11,17` on Gemma 3 270M) has no local layer: its graph takes no
    `past_positions`, and it drafts losslessly."""
    import json
    import shutil

    d = tmp_path / "global"
    src = tiny_dir("gemma3_text", num_layers=1, hidden_size=32, seed=7)  # shared: not its exports
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("*.onnx", "*.onnx.data", ".duet"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = ["full_attention"]
    (d / "config.json").write_text(json.dumps(cfg))
    ids = np.random.default_rng(0).integers(0, 320, (1, 12))
    ref = load_model(d, "torch", threads=1)
    m = load_model(d, "onnx")
    np.testing.assert_allclose(
        m.forward(ids, m.new_cache()), ref.forward(ids, ref.new_cache()), atol=TOL, rtol=0
    )
    target = load_model(gemma, "torch", threads=1)
    assert gen("sd", target, m).tokens == gen("ar", target, None).tokens
