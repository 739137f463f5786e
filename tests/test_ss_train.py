"""`python -m apps.train ss-draft`: a few steps on tiny models learn, save a loadable SS
draft, and a CUDA request without a GPU is one clear line."""

import json

import pytest
import torch

from apps.train.__main__ import main
from runtime.loading import load_model


@pytest.fixture(scope="module")
def setup(tiny_dir, tmp_path_factory):
    corpus = tmp_path_factory.mktemp("sscorpus")
    for i in range(6):
        body = "".join(f"def f{i}_{k}(x):\n    return x * {k} + {i}\n\n" for k in range(40))
        (corpus / f"m{i}.py").write_text(body)
    return tiny_dir("qwen3"), tiny_dir("qwen3", num_layers=2, seed=7), corpus


def _args(setup, out, *extra):
    td, dd, corpus = setup
    return [
        "ss-draft",
        "--target",
        str(td),
        "--draft",
        str(dd),
        "--out",
        str(out),
        "--corpus",
        str(corpus),
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--streams",
        "2",
        *extra,
    ]


def test_a_few_steps_lower_the_heldout_kl_and_save_an_ss_draft(setup, tmp_path):
    out = tmp_path / "ss"
    assert main(_args(setup, out, "--steps", "12", "--lr", "3e-3", "--device", "cpu")) == 0
    rep = json.loads((out / "ss_train_report.json").read_text())
    assert rep["steps"] == 12 and rep["device"] == "cpu"
    kl = lambda h: h["kl_main"] + h["kl_s1"] + h["kl_s2"]  # noqa: E731
    assert kl(rep["heldout_after"]) < kl(rep["heldout_before"]) - 0.05
    m = load_model(out, "torch")
    assert m.ss_streams == 2
    assert m.forward([[1, 2, 3]], m.new_cache()).shape == (1, 3, m.config.vocab_size)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu_is_one_clear_line(setup, tmp_path, capsys):
    assert main(_args(setup, tmp_path / "ss", "--steps", "1", "--device", "cuda")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "sees no CUDA GPU" in err[0]
