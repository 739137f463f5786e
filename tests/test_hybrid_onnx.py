"""The ONNX hybrid (Qwen3.5) draft: export parity through the converters CLI, exact rollback by
picking per-position states, and lossless greedy `sd` with it as the draft."""

import json

import numpy as np
import pytest
import torch

from converters.__main__ import main as convert
from converters.onnx_export import export_onnx
from converters.onnx_hybrid_export import export_hybrid_onnx
from runtime.backends import load_model
from runtime.backends.onnx import load_onnx_lm
from runtime.backends.onnx.qwen3_5 import OnnxHybridLM, hybrid_io_names
from runtime.decoding import make_steps, run
from runtime.decoding.events import GREEDY
from runtime.errors import DuetError

ATOL_REF = 1e-4  # ONNX states vs the PyTorch reference's: the same maths, other kernels
PROMPT = [5, 17, 42, 99, 7, 256, 3]
N_NEW = 16


@pytest.fixture(scope="module")
def pair(tiny_dir, tmp_path_factory):
    """A hybrid target (torch), its 2-layer hybrid draft and a 2 %-noise copy, both as ONNX."""
    out = tmp_path_factory.mktemp("onnx_hybrid")
    tdir, ddir = tiny_dir("qwen3_5_text", seed=1), tiny_dir("qwen3_5_text", num_layers=2, seed=2)
    export_onnx(ddir, out / "draft.onnx")
    near = load_model(tdir, "torch", threads=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # accepts 0, some or all of a window
        for p in near.module.parameters():
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=g) * 0.02 * p.std())
    export_hybrid_onnx(near.module, out / "near.onnx")
    return {
        "tdir": tdir,
        "ddir": ddir,
        "target": load_model(tdir, "torch", threads=1),
        "draft": load_model(out / "draft.onnx"),
        "near": load_onnx_lm(out / "near.onnx", config_dir=tdir),
        "near_ref": near,
    }


def prefill(model, seq):
    c = model.new_cache()
    if seq:
        model.forward(np.array([seq]), c)
    return c


def assert_same_states(cache, fresh, atol=0.0):
    assert cache.offset == fresh.offset
    for i, (got, want) in enumerate(zip(cache.states(), fresh.states(), strict=True)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(
                np.asarray(g), np.asarray(w), atol=atol, err_msg=f"layer {i}"
            )


def test_export_cli_reports_parity_and_the_state_io(pair, tmp_path, capsys):
    out = tmp_path / "h.onnx"
    argv = ["export", "--model", str(pair["ddir"]), "--format", "onnx", "--out", str(out), "--json"]
    assert convert(argv) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ok"] and info["parity"]["max_abs"] <= info["tolerance"] == 1e-3
    assert info["parity"]["top1_agree"] == 1.0
    import onnx

    m = onnx.load(str(out))
    ins, outs = hybrid_io_names(pair["draft"].config)
    assert [i.name for i in m.graph.input] == ins and [o.name for o in m.graph.output] == outs
    assert "past_conv.0" in ins and "past_key_values.1.key" in ins
    model = load_model(out)  # self-describing: the config is in the file's metadata
    assert isinstance(model, OnnxHybridLM) and model.config.model_type == "qwen3_5_text"


def test_states_match_the_reference(pair):
    ref = pair["near_ref"]
    a, b = prefill(pair["near"], PROMPT), prefill(ref, PROMPT)
    for (g1, g2), (w1, w2) in zip(a.states(), b.states(), strict=True):
        np.testing.assert_allclose(g1, w1.numpy(), atol=ATOL_REF)
        np.testing.assert_allclose(g2, w2.numpy(), atol=ATOL_REF)


@pytest.mark.parametrize("keep", [0, 2, 4])
def test_trim_picks_the_states_of_the_prefix(pair, keep):
    m = pair["near"]
    c = prefill(m, PROMPT)
    m.forward(np.array([[11, 12, 13, 14]]), c)
    c.trim(4 - keep)
    assert_same_states(c, prefill(m, PROMPT + [11, 12, 13, 14][:keep]))


def test_trim_past_the_window_empties_the_cache(pair):
    m = pair["near"]
    c = prefill(m, PROMPT)
    c.window = 2
    m.forward(np.array([[11, 12, 13]]), c)
    c.trim(2)  # kept
    assert_same_states(c, prefill(m, PROMPT + [11]))
    c.trim(3)  # older than the window: start over rather than guess
    assert c.offset == 0


@pytest.mark.parametrize("draft", ["draft", "near"])
def test_greedy_sd_with_the_onnx_hybrid_draft_equals_ar(pair, draft):
    target, d = pair["target"], pair[draft]
    ar = run(
        make_steps("ar", target, None, PROMPT, max_new=N_NEW, sampling=GREEDY, seed=0),
        max_new=N_NEW,
    ).tokens
    dc, seq, accepted = d.new_cache(), list(PROMPT), set()
    steps = make_steps(
        "sd", target, d, PROMPT, max_new=N_NEW, sampling=GREEDY, seed=0, gamma=4, draft_cache=dc
    )
    for ev in steps:
        seq += ev.tokens
        accepted.add(ev.accepted)
        # a fresh prefill of a long sequence runs prefill chunks: other sums, same maths
        assert_same_states(dc, prefill(d, seq[: dc.offset]), atol=ATOL_REF)
    assert seq[len(PROMPT) :][:N_NEW] == ar
    if draft == "near":
        assert {0, 4} < accepted, f"want rejections, partial and full windows (got {accepted})"


def test_a_hole_mask_without_forked_rows_is_refused(pair):
    m = pair["draft"]
    c = prefill(m, PROMPT)
    mask = np.ones((1, len(PROMPT) + 1), bool)
    mask[0, 2] = False
    with pytest.raises(DuetError, match="hybrid ONNX draft takes causal masks"):
        m.forward(np.array([[1]]), c, mask=mask)


def test_static_shapes_refuse_hybrids_in_one_line(pair, tmp_path, capsys):
    argv = ["export", "--model", str(pair["ddir"]), "--format", "onnx", "--static-shapes",
            "--quantize", "int8", "--out", str(tmp_path / "s.onnx")]  # fmt: skip
    assert convert(argv) == 2
    assert "not built for hybrid qwen3_5_text" in capsys.readouterr().err


def test_a_long_prompt_runs_through_the_prefill_graph_and_stays_landable(pair):
    m, ref = pair["near"], pair["near_ref"]
    assert m.prefill is not None  # exported beside the one-token graph
    ids = np.random.default_rng(1).integers(0, 320, (1, 40))  # two 16-token chunks + 8 single
    c, rc = m.new_cache(), ref.new_cache()
    np.testing.assert_allclose(m.forward(ids, c), ref.forward(ids, rc), atol=1e-3)
    for (g1, g2), (w1, w2) in zip(c.states(), rc.states(), strict=True):
        np.testing.assert_allclose(g1, w1.numpy(), atol=ATOL_REF)
        np.testing.assert_allclose(g2, w2.numpy(), atol=ATOL_REF)
    c.trim(1)  # the last token ran alone: the states before it are kept
    assert_same_states(c, prefill(m, ids[0, :39].tolist()), atol=ATOL_REF)
    c.trim(20)  # inside a chunk: no states there, the cache starts over
    assert c.offset == 0


def test_a_hybrid_target_on_onnx_runs_the_draft_export_losslessly(pair, capsys):
    """`--target-backend onnx` on a hybrid checkpoint runs the draft export's one-token graph as
    the target (its recurrent states kept per position, float32 weights; --quantize does not
    apply and the stats say why): greedy sd with a draft model and with prompt lookup equals
    that target's own ar."""
    from runtime.generate import main as generate

    ids = ",".join(map(str, PROMPT * 2))
    base = ["--target", str(pair["tdir"]), "--target-backend", "onnx", "--prompt-ids", ids,
            "--max-tokens", "12", "--json"]  # fmt: skip
    got = []
    for extra in (
        ["--method", "ar"],
        ["--method", "sd", "--draft", str(pair["ddir"])],
        ["--method", "sd", "--draft", "lookup"],
    ):
        assert generate([*base, *extra]) == 0
        got.append(json.loads(capsys.readouterr().out))
    assert got[0]["tokens"] == got[1]["tokens"] == got[2]["tokens"]
    s = got[0]["stats"]
    assert s["target_backend"] == "onnx" and s["target_quantize"] == "none"
    assert "one-token graph" in s["target_backend_why"]
