"""The tuned exit head: it changes what the early-exit message proposes, never the output;
asking for one that was not trained is one clear error; fitting it lowers the KL it fits."""

import numpy as np
import pytest
from decode_helpers import ar_greedy, greedy_steps

from apps.train.corpus import Corpus
from apps.train.exit_head import fit
from runtime.backends import load_model
from runtime.errors import DuetError
from runtime.mirror.exit_head import ExitHead, exit_head_path
from runtime.tokenizer import Tokenizer

PROMPT = [11, 42, 7, 99, 5, 250]


def mirror_events(target, draft, exit_head):
    opts = dict(gamma=3, kappa=4, exit_layer=2, exit_head=exit_head)
    evs = list(greedy_steps("mirror", target, draft, PROMPT, 30, **opts))
    return [t for e in evs for t in e.tokens][:30], evs


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_tuned_exit_head_changes_the_proposal_never_the_output(tiny_dir, backend):
    tdir = tiny_dir("qwen3", seed=77)  # its own checkpoint: a stored head is used by default
    rng = np.random.default_rng(0)
    d = 64
    w = np.eye(d, dtype=np.float32) + 0.5 * rng.standard_normal((d, d)).astype(np.float32)
    ExitHead(w, 0.1 * rng.standard_normal(d).astype(np.float32)).save(exit_head_path(tdir, 2))
    target = load_model(tdir, backend)
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx")
    ref = ar_greedy(target, PROMPT, 30)
    raw, raw_ev = mirror_events(target, draft, "raw")
    tuned, tuned_ev = mirror_events(target, draft, None)  # default: the stored one
    assert raw == tuned == ref
    assert {e.extra["exit_head"] for e in tuned_ev} == {"tuned"}
    assert {e.extra["exit_head"] for e in raw_ev} == {"raw"}
    omegas = lambda evs: [e.extra["omega_kappa"] for e in evs]  # noqa: E731
    assert omegas(raw_ev) != omegas(tuned_ev)  # the proposal did change


def test_asking_for_a_missing_tuned_head_is_one_clear_error(tiny_dir):
    target = load_model(tiny_dir("llama"), "torch")
    draft = load_model(tiny_dir("llama", num_layers=1, seed=4), "onnx")
    with pytest.raises(DuetError, match="python -m apps.train exit-head"):
        mirror_events(target, draft, "tuned")


def test_fitting_lowers_the_held_out_kl(tiny_dir, tmp_path):
    text = "".join(chr(97 + (i * 7 + i // 5) % 26) for i in range(3000))
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(text)
    tdir = tiny_dir("qwen3")
    res = fit(
        load_model(tdir, "torch"),
        Tokenizer(tdir),
        Corpus(tmp_path, ("a.py",), ("b.py",)),
        2,
        steps=40,
        batch=128,
        lr=1e-2,
        max_tokens=1024,
        seq_len=128,
        log=lambda _: None,
    )
    r = res["report"]
    assert r["heldout_kl_tuned"] < r["heldout_kl_raw"]
    assert res["weight"].shape == (64, 64) and res["bias"].shape == (64,)
