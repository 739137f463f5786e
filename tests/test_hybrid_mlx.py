"""Hybrid Qwen3.5 on the MLX backend (mlx-lm's qwen3_5 classes, our walk, MLXHybridCache):
parity with Hugging Face, the PyTorch reference and mlx-lm's own forward; exact rollback of
the linear states; lossless greedy `sd` and `mirror` on an MLX hybrid target."""

import json

import numpy as np
import pytest
from decode_helpers import greedy_steps, prefill
from test_hybrid import (
    N_NEW,
    PROMPT,
    assert_llama_cpp_rounds,
    check_fork_and_select,
    check_hf_parity,
    check_mirror_lands_states,
    check_text_tower,
    check_trim_lands_on_the_prefix,
    generate,
    hf_greedy,
    near_copy,
)
from test_hybrid import assert_states_close as check_states_close

from runtime.backends import load_model
from runtime.errors import DuetError

ATOL_HF = 2e-4  # logits (|x| up to ~10) vs transformers / the torch reference (fp32, other sums)
ATOL_MLX_LM = 1e-5  # vs mlx-lm's own uncached forward: the same ops, other batch shapes
ATOL_STATE = 1e-5  # landed states vs a fresh prefill (measured max ~1e-6)


@pytest.fixture(scope="module")
def models(tiny_dir):
    tdir = tiny_dir("qwen3_5_text", seed=1)
    return {
        "dir": tdir,
        "target": load_model(tdir, "mlx"),
        "torch_target": load_model(tdir, "torch", threads=1),
        "hybrid_draft": load_model(tiny_dir("qwen3_5_text", num_layers=2, seed=2), "mlx"),
        "attn_draft": load_model(tiny_dir("qwen3", num_layers=1, seed=3), "mlx"),
        "near_draft": near_copy(tdir),  # torch: 0, 1, 3 or all 4 of a window accepted
        "hf_greedy": hf_greedy(tdir, N_NEW),
    }


def test_logits_match_hugging_face_the_reference_and_mlx_lm(models):
    import mlx.core as mx

    m = models["target"]
    ids, ours = check_hf_parity(m, models["dir"])
    ref = models["torch_target"]
    np.testing.assert_allclose(ours, ref.forward(ids, ref.new_cache(batch=2)), atol=ATOL_HF)
    np.testing.assert_allclose(ours, np.array(m.model(mx.array(ids))), atol=ATOL_MLX_LM)


def test_states_match_the_torch_reference(models):
    """mlx-lm's layouts are the reference's transposed: conv (B, K-1, C), rec (B, Hv, Dv, Dk)."""
    m, ref = models["target"], models["torch_target"]
    ours, theirs = prefill(m, PROMPT).states(), prefill(ref, PROMPT).states()
    for i, (kind, a, b) in enumerate(zip(m.config.layer_types, ours, theirs, strict=True)):
        if kind == "linear_attention":
            want = (b[0].numpy().transpose(0, 2, 1), b[1].numpy().transpose(0, 1, 3, 2))
        else:
            want = tuple(t.numpy() for t in b)
        for x, y in zip(a, want, strict=True):
            np.testing.assert_allclose(np.array(x), y, atol=1e-5, err_msg=f"layer {i}")


def test_multimodal_layout_loads_its_text_tower(tiny_dir, models, capsys):
    check_text_tower(load_model(tiny_dir("qwen3_5", seed=1), "mlx"), models, capsys)


def assert_states_close(cache, fresh):
    check_states_close(cache, fresh, ATOL_STATE)


@pytest.mark.parametrize("keep", [0, 1, 3, 5])
def test_trim_lands_every_state_on_the_prefix(models, keep):
    check_trim_lands_on_the_prefix(models["target"], keep, ATOL_STATE)


def test_trim_across_single_token_forwards_and_before_the_log(models):
    m = models["target"]
    c = prefill(m, PROMPT)
    for t in (21, 22, 23, 24):
        m.forward(np.array([[t]]), c)
    c.trim(3)  # lands across forwards by replay
    assert_states_close(c, prefill(m, PROMPT + [21]))
    c.trim(3)  # before the log (restarted at the landing): the cache empties
    assert c.offset == 0
    m.forward(np.array([PROMPT[:4]]), c)
    assert_states_close(c, prefill(m, PROMPT[:4]))


def test_fork_and_select_rows_carry_states_and_logs(models):
    check_fork_and_select(models["target"], ATOL_STATE)


@pytest.mark.parametrize("draft", ["hybrid_draft", "attn_draft", "near_draft"])
def test_greedy_sd_equals_ar_and_hugging_face(models, draft):
    target = models["target"]
    assert generate("ar", target) == models["hf_greedy"]
    assert generate("sd", target, models[draft], gamma=3) == models["hf_greedy"]


@pytest.mark.parametrize("rollback", ["replay", "redecode"])
def test_states_equal_a_fresh_prefill_after_every_sd_step(models, rollback):
    from runtime.backends.mlx.qwen3_5 import MLXQwen3_5LM

    target, draft = models["target"], models["near_draft"]
    target = MLXQwen3_5LM(target.model, target.config, hybrid_rollback=rollback)
    tc = target.new_cache()
    seq = list(PROMPT)
    steps = greedy_steps("sd", target, draft, PROMPT, N_NEW, gamma=4, target_cache=tc)
    accepted, out = set(), []
    for ev in steps:
        seq += ev.tokens
        out += ev.tokens
        accepted.add(ev.accepted)
        assert_states_close(tc, prefill(target, seq[: tc.offset]))
    assert {0, 4} < accepted, f"want rejections, partial and full windows (got {accepted})"
    assert out[:N_NEW] == models["hf_greedy"]


def test_mlx_redecode_re_verifies_the_kept_tokens_as_llama_cpp_does(models):
    """The MLX cache inherits redecode's bookkeeping: after a rejection sd restores the
    checkpoint and re-verifies the A + 1 kept tokens and the correction as its next window,
    never a pass of its own nor a grown window (as tests/test_hybrid.py)."""
    from runtime.backends.mlx.qwen3_5 import MLXQwen3_5LM

    m, draft = models["target"], models["near_draft"]
    replay = MLXQwen3_5LM(m.model, m.config, hybrid_rollback="replay")
    redecode = MLXQwen3_5LM(m.model, m.config, hybrid_rollback="redecode")
    assert_llama_cpp_rounds(replay, redecode, draft)


@pytest.mark.parametrize("exit_layer", [1, 2])  # stop after a linear / an attention layer
def test_mirror_on_an_mlx_hybrid_target_equals_ar_and_lands_states(models, exit_layer):
    check_mirror_lands_states(models, exit_layer, models["hf_greedy"], ATOL_STATE)


def test_what_mlx_hybrids_refuse_in_one_line(models, tiny_dir, tmp_path):
    import shutil

    m = models["target"]
    with pytest.raises(DuetError, match="causal windows only"):
        m.forward(np.array([[1, 2]]), m.new_cache(), mask=np.ones((2, 2), dtype=bool))
    odd = tmp_path / "odd"  # linear, full, full, linear: no full_attention_interval fits
    shutil.copytree(models["dir"], odd)
    cfg = json.loads((odd / "config.json").read_text())
    cfg["layer_types"] = ["linear_attention", "full_attention", "full_attention",
                          "linear_attention"]  # fmt: skip
    (odd / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DuetError, match="do not follow one interval"):
        load_model(odd, "mlx")
    from runtime.decoding import cannot_run

    # an MLX hybrid draft cannot fork its states per branch row (non-causal masks)
    assert "cannot fork its states per row" in cannot_run("mirror", m, m)


def test_generate_cli_runs_mlx_hybrid_pairs_and_refuses_mtp(models, tiny_dir, capsys):
    from runtime.generate import main

    draft = tiny_dir("qwen3_5_text", num_layers=2, seed=2)
    base = ["--target", str(models["dir"]), "--prompt-ids", "5,17,42", "--max-tokens", "6",
            "--json", "--target-backend", "mlx"]  # fmt: skip
    sd = ["--method", "sd", "--draft", str(draft), "--draft-backend", "mlx"]
    outs = []
    for extra in (["--method", "ar"], sd, [*sd, "--hybrid-rollback", "redecode"]):
        assert main([*base, *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out)["tokens"])
    assert outs[0] == outs[1] == outs[2]
    assert main([*base, "--method", "sd", "--draft", "mtp"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--draft mtp runs beside a PyTorch or an ONNX target" in err and "\n" not in err


def test_mlx_lm_baseline_shows_its_own_refusal(models, tiny_dir):
    from types import SimpleNamespace

    from apps.bench.runners.mlx_lm import MlxLmRunner

    pair = SimpleNamespace(
        target=models["target"],
        target_dir=models["dir"],
        draft_path=tiny_dir("qwen3", num_layers=1, seed=3),
    )
    turn = MlxLmRunner(pair, gamma=3).generate([5, 17, 42], 4, 0.0, 1.0, 0)
    assert turn.refused.startswith("mlx-lm: Speculative decoding requires a trimmable prompt cache")
    assert turn.tokens == []


def test_rollback_bench_runs_on_mlx(models, capsys):
    from apps.bench.studies.hybrid_rollback import main

    argv = ["--target", str(models["dir"]), "--backend", "mlx", "--gamma", "2", "--reps", "1",
            "--prompt-len", "4"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["backend"] == "mlx" and set(res["replay_ms"]) == {"0", "1", "2"}
    assert all(v >= 0 for v in res["redecode_ms"].values()) and res["verify_ms"] > 0


def test_mlx_quantization_of_hybrids(models, tiny_dir, tmp_path):
    """mlx-lm's converter quantizes the multimodal layout (our MLX backend loads the result and
    lands its states); the text-only layout, which it has no class for, is refused."""
    import shutil

    from converters.mlx_quantize import quantize_mlx

    with pytest.raises(DuetError, match="no qwen3_5_text model"):
        quantize_mlx(models["dir"], tmp_path / "q_text")
    mm = tmp_path / "mm"
    shutil.copytree(tiny_dir("qwen3_5", seed=1), mm)
    cfg = json.loads((mm / "config.json").read_text())
    cfg["text_config"]["full_attention_interval"] = 2  # what mlx-lm builds the layers from
    (mm / "config.json").write_text(json.dumps(cfg))
    quantize_mlx(mm, tmp_path / "q8", bits=8, parity=False)
    q = load_model(tmp_path / "q8", "mlx")
    c = prefill(q, PROMPT)
    q.forward(np.array([[11, 12, 13]]), c)
    c.trim(2)
    assert_states_close(c, prefill(q, PROMPT + [11]))


@pytest.fixture(scope="module")
def sampling_pair(tiny_dir):
    """test_hybrid_sampling_gof's pair (a peaked hybrid draft), both on MLX."""
    from test_sampling_gof import V

    kw = dict(vocab_size=V, tokenizer=False, hidden_size=32)
    tdir = tiny_dir("qwen3_5_text", num_layers=2, seed=1, initializer_range=0.12, **kw)
    ddir = tiny_dir("qwen3_5_text", num_layers=1, seed=2, initializer_range=0.6, **kw)
    return load_model(tdir, "mlx"), load_model(ddir, "mlx")


@pytest.mark.parametrize("control", [False, True])
def test_sd_on_an_mlx_hybrid_target_keeps_its_law(sampling_pair, monkeypatch, control):
    """The chi-square test of tests/test_sampling_gof.py at T > 0; the negative control (a
    flattened q in the acceptance rule) must fail it."""
    from test_hybrid_sampling_gof import N
    from test_sampling_gof import (
        ALPHA,
        exact_joint,
        gof_pvalue,
        sample_pairs,
        verify_with_a_flattened_q,
    )

    target, draft = sampling_pair
    if control:
        verify_with_a_flattened_q(monkeypatch)
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert (p < ALPHA) if control else (p > ALPHA), f"control={control}: p = {p:.2e}"


def test_mtp_weights_are_not_needed_and_not_loaded(models, tiny_dir):
    """mlx-lm's sanitize drops `mtp.*`: the checkpoint with a head runs as the one without."""
    m = load_model(tiny_dir("qwen3_5_text", seed=1, mtp=True), "mlx")
    ids = np.array([PROMPT])
    a = m.forward(ids, m.new_cache())
    np.testing.assert_array_equal(a, models["target"].forward(ids, models["target"].new_cache()))
