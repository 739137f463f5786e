"""`python -m apps.train mtp`: a head fitted for a plain (Qwen3) or hybrid target loads back
from the sidecar, `--draft mtp` with it is lossless (greedy equals `ar`; the sampling
chi-square test with its negative control), the training chain is the inference chain, and
a stopped run resumes."""

import json

import numpy as np
import pytest
import torch

from apps.train.mtp import chain_outputs, init_head, main, mtp_step, save_head, target_pass
from converters.onnx_mtp import MTP_INT8_RTOL
from runtime.backends import load_model
from runtime.decoding import make_steps, run
from runtime.decoding.events import GREEDY
from runtime.drafts.mtp.torch import MTPDraft, mtp_sidecar

PROMPT = [5, 17, 42, 99, 7]
N_NEW = 16
ATOL = 1e-4  # float32: the batched training chain vs the one-token-at-a-time draft
BF16_ATOL = 1e-2
# ONNX Runtime's kernels vs PyTorch's (converters/onnx_mtp.py MTP_ONNX_ATOL)
# saved weights are bf16: |w - bf16(w)| <= 2^-8 |w|
ONNX_ATOL = 1e-3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    for i in range(3):
        (d / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + 1\n" * 12)
    return d


def _fit(target_dir, corpus, steps, *extra):
    return main(
        [
            "--target",
            str(target_dir),
            "--corpus",
            str(corpus),
            "--steps",
            str(steps),
            "--seq-len",
            "24",
            "--batch-size",
            "2",
            "--eval-tokens",
            "48",
            "--ckpt-every",
            "1",
            "--unroll",
            "2",
            *extra,
        ]
    )


def _greedy_equals_ar(target_dir):
    """sd with the head, stepped in PyTorch and in ONNX Runtime (fp32 and int8 weights), gives
    ar's tokens; the PyTorch and fp32 ONNX steppers give the same draft logits, the int8 one
    close logits. Returns the PyTorch draft."""
    import onnx

    target = load_model(target_dir, "torch", threads=1)
    ar = run(
        make_steps("ar", target, None, PROMPT, max_new=N_NEW, sampling=GREEDY, seed=0),
        max_new=N_NEW,
    ).tokens
    drafts = {"torch": MTPDraft.load(target, target_dir),
              "onnx": MTPDraft.load(target, target_dir, backend="onnx", quant="fp32"),
              "int8": MTPDraft.load(target, target_dir, backend="onnx")}  # fmt: skip
    ops = {n.op_type for n in onnx.load(str(mtp_sidecar(target_dir) / "step.int8.onnx")).graph.node}
    assert "MatMulNBits" in ops  # the default ONNX step reads int8 weights
    for draft in drafts.values():
        for gamma in (1, 3):
            sd = make_steps(
                "sd", target, draft, PROMPT, max_new=N_NEW, sampling=GREEDY, seed=0, gamma=gamma
            )
            assert run(sd, max_new=N_NEW).tokens == ar
    tc = target.new_cache()
    target.forward(np.array([ar[:8]]), tc)  # the head reads h_0..h_7, then chains
    got = {
        b: [d.forward(np.array([ar[:9]]), c := d.new_cache())[0]]
        + [d.forward(np.array([[t]]), c)[0] for t in ar[9:12]]
        for b, d in drafts.items()
    }
    np.testing.assert_allclose(
        np.concatenate(got["onnx"]), np.concatenate(got["torch"]), atol=ONNX_ATOL, rtol=ONNX_ATOL
    )
    ref, q8 = np.concatenate(got["onnx"]), np.concatenate(got["int8"])
    assert np.abs(q8 - ref).max() <= MTP_INT8_RTOL * max(1.0, np.abs(ref).max())
    return drafts["torch"]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5_text"])
def test_fitted_head_loads_back_and_is_lossless(tiny_dir, corpus, arch, tmp_path, capsys):
    import shutil

    target_dir = tmp_path / "target"
    shutil.copytree(tiny_dir(arch, seed=3), target_dir)
    assert _fit(target_dir, corpus, 2) == 0
    out = json.loads(capsys.readouterr().out)
    side = mtp_sidecar(target_dir)
    assert out["wrote"] == str(side) and out["steps"] == 2
    rec = json.loads((side / "mtp.json").read_text())
    assert rec["kind"] == "duet-mtp-head" and rec["target"]["model_type"] == arch
    draft = _greedy_equals_ar(target_dir)
    trained = torch.load(side / ".resume" / "state.pt", weights_only=False)["head"]
    for k, v in draft.head_module.state_dict().items():  # the fitted weights, as bf16
        np.testing.assert_allclose(v.numpy(), trained[k].numpy(), atol=BF16_ATOL, rtol=BF16_ATOL)


def test_a_stopped_run_resumes(tiny_dir, corpus, tmp_path, capsys):
    out = tmp_path / "mtp"
    assert _fit(tiny_dir("qwen3", seed=3), corpus, 2, "--out", str(out)) == 0
    capsys.readouterr()
    assert _fit(tiny_dir("qwen3", seed=3), corpus, 3, "--out", str(out), "--tv-weight", "0.5") == 0
    printed = capsys.readouterr().out
    rec = json.loads(printed[printed.index("{") :])
    assert "resuming" in printed and rec["steps"] == 3 and rec["tv_weight"] == 0.5
    assert 0 <= rec["heldout_tv_1"] <= 1  # the held-out TV distance per chained step
    assert not (mtp_sidecar(tiny_dir("qwen3", seed=3)) / "model.safetensors").exists()


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5_text"])
def test_training_chain_is_the_drafting_chain(tiny_dir, arch):
    """Step r of the unrolled loss at entry j gives the logits the draft gives for its r-th
    token when the target has committed x_0..x_{c-1} and the drafts are the true tokens."""
    target = load_model(tiny_dir(arch, seed=3), "torch", threads=1)
    head = init_head(target)
    with torch.no_grad():  # move off the identity start so every part of the layer counts
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x = torch.tensor([[3, 9, 27, 81, 243, 7, 21, 63, 189, 5, 15]])
    c = 6
    hid, _ = target_pass(target, x)
    outs = chain_outputs(target, head, x, hid, 3)
    w = target.module.lm_head.weight
    draft = MTPDraft(target, head)
    tc, dc = target.new_cache(), draft.new_cache()
    target.forward(x[:, :c].numpy(), tc)  # records h_0 .. h_{c-1}
    got = [draft.forward(x[:, : c + 1].numpy(), dc)[0, -1]]
    got += [draft.forward(x[:, c + r : c + r + 1].numpy(), dc)[0, -1] for r in (1, 2)]
    for r in (1, 2, 3):
        want = (outs[r - 1][0, c + r - 2] @ w.T).detach().numpy()
        np.testing.assert_allclose(got[r - 1], want, atol=ATOL, rtol=ATOL)


V = 8
N = 500  # seeded draws; measured: p = 0.31 here, the negative control p = 7e-31
ALPHA = 1e-3


@pytest.fixture(scope="module")
def gof_pair(tiny_dir, tmp_path_factory):
    """A V = 8 Qwen3 target and its head, fitted a few steps on random text, saved and loaded."""
    d = tiny_dir("qwen3", seed=1, vocab_size=V, tokenizer=False, initializer_range=0.12)
    target = load_model(d, "torch", threads=1)
    head = init_head(target)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    step, g = mtp_step(target, head, 2), torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randint(0, V, (2, 17), generator=g)
        loss, _ = step(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = tmp_path_factory.mktemp("side")
    save_head(head, out, d, {"steps": 3})
    target_dir = tmp_path_factory.mktemp("gof_target")
    for f in d.iterdir():
        if f.name != ".duet":  # another test's exports may sit in the shared tiny target's
            (target_dir / f.name).symlink_to(f)
    (target_dir / ".duet").mkdir()
    (target_dir / ".duet" / "mtp").symlink_to(out)
    return target, MTPDraft.load(target, target_dir), target_dir


@pytest.mark.parametrize("stepper", ["torch", "onnx int8"])
def test_sampling_with_the_fitted_head_matches_the_target(gof_pair, stepper):
    """Also with the int8-weight ONNX step: its q differs from the float head's, and the
    verifier must accept with exactly that q."""
    from test_sampling_gof import exact_joint, gof_pvalue, sample_pairs

    target, draft, target_dir = gof_pair
    if stepper != "torch":
        draft = MTPDraft.load(target, target_dir, backend="onnx", quant="int8")
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert p > ALPHA, f"sd with the MTP head: joint law differs from the target's (p = {p:.2e})"


def test_negative_control_wrong_q_fails_with_the_head(gof_pair, monkeypatch):
    from test_sampling_gof import exact_joint, gof_pvalue, sample_pairs, verify_with_a_flattened_q

    target, draft, _ = gof_pair
    verify_with_a_flattened_q(monkeypatch)
    p = gof_pvalue(sample_pairs("sd", target, draft, N, seed=0), exact_joint(target))
    assert p < ALPHA, f"the negative control passed (p = {p:.2e}); the test has no power"


def test_bench_runs_sd_with_the_head_beside_sd(tiny_dir, corpus, tmp_path, capsys):
    """`apps.bench --drafts mtp`: a `sd+mtp` row alternated with `sd`, greedy equal to ar."""
    import shutil

    from apps.bench.__main__ import main as bench

    t = tmp_path / "target"
    shutil.copytree(tiny_dir("qwen3", seed=3), t)
    assert _fit(t, corpus, 1) == 0
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "code", "turns": ["def f(x):"]}))
    capsys.readouterr()
    assert (
        bench(
            [
                "--target",
                str(t),
                "--draft",
                str(t),
                "--draft-backend",
                "onnx",
                "--prompts",
                str(q),
                "--max-tokens",
                "6",
                "--temps",
                "0",
                "--no-warmup",
                "--methods",
                "ar,sd",
                "--drafts",
                "mtp,mtp-fp32",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["method"] for r in rows] == ["ar", "sd", "sd+mtp", "sd+mtp-fp32"]
    assert all(r["matches_ar"] == "1/1" for r in rows)


def test_draft_mtp_beside_a_non_torch_target_is_one_line(tiny_dir, capsys):
    from runtime.generate import main as generate

    argv = ["--target", str(tiny_dir("qwen3", seed=3)), "--draft", "mtp", "--method", "sd",
            "--target-backend", "mlx", "--prompt-ids", "5,17", "--max-tokens", "2"]  # fmt: skip
    assert generate(argv) == 2
    assert "runs beside a PyTorch or an ONNX target" in capsys.readouterr().err


def test_tv_term_is_half_the_l1_distance():
    """distill_loss's TV term: ½ Σ|p - q| per token, added x tv_weight to the KL loss."""
    from apps.train.losses import distill_loss

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    y = torch.zeros(2, 3, dtype=torch.long)
    kl, m0 = distill_loss(s, t, y)
    both, m = distill_loss(s, t, y, tv_weight=2.0)
    want = 0.5 * (t.softmax(-1) - s.softmax(-1)).abs().sum(-1).mean()
    assert m["tv"] == pytest.approx(want.item(), rel=1e-5) and m0["tv"] == m["tv"]
    assert both.item() == pytest.approx(kl.item() + 2.0 * want.item(), rel=1e-5)
