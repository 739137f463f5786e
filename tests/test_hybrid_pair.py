"""`python -m apps.train --arch qwen3_5` builds a hybrid pair that our runtime loads and decodes
losslessly, and hybrid greedy output through runtime.chat and apps.server equals
`runtime.generate --method ar`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from server_helpers import openai_client, served

from apps.train.configs import parse_shape
from apps.train.pipeline import TrainArgs, train_pair
from runtime.backends import load_model
from runtime.chat_session import ChatSession
from runtime.decoding import make_steps, run
from runtime.decoding.events import GREEDY
from runtime.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
ATOL_HF = 2e-4  # as tests/test_hybrid.py: a chunked (HF) vs token-by-token (ours) delta rule
N_NEW = 16


def corpus(root: Path) -> Path:
    """A dozen small Python files, enough for a train and a held-out split."""
    root.mkdir()
    for i in range(12):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(30))
        (root / f"m{i}.py").write_text(body)
    return root


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("hybpair")
    args = TrainArgs(
        out=base / "out",
        corpus=corpus(base / "corpus"),
        heldout_frac=0.3,
        seq_len=32,
        batch_size=2,
        target_shape=parse_shape("64,4,128,2,1,32", tie=False),
        draft_shape=parse_shape("32,2,64,2,1,16", tie=True),
        target_steps=3,
        draft_steps=2,
        threads=1,
        ckpt_every=2,
        evaluate=False,
        allow_draft_over_budget=True,
        arch="qwen3_5",
    )
    report = train_pair(args)
    return args, report


def test_builds_a_hybrid_pair_on_the_embedded_vocabulary(pair):
    args, report = pair
    from runtime.assets import default_pair

    for name in ("target", "draft"):
        cfg = json.loads((args.out / name / "config.json").read_text())
        assert cfg["model_type"] == "qwen3_5_text"
        assert set(cfg["layer_types"]) == {"linear_attention", "full_attention"}
        tok = json.loads((args.out / name / "tokenizer.json").read_text())  # the same tokenizer,
        assert tok == json.loads((default_pair()[0] / "tokenizer.json").read_text())  # any layout
    assert report["stages"]["target"]["steps"] == 3 and report["stages"]["draft"]["steps"] == 2
    assert report["arch"] == "qwen3_5" and 0 < report["draft_target_flop_ratio"] < 1
    for name in ("target", "draft"):  # our reference read the checkpoint as transformers does
        assert report["stages"][name]["reference_parity"]["max_abs_diff"] <= ATOL_HF


def test_our_reference_equals_hugging_face_on_the_trained_checkpoint(pair):
    from transformers import AutoModelForCausalLM

    args, _ = pair
    for name in ("target", "draft"):
        path = args.out / name
        ours = load_model(path, "torch", threads=1)
        assert ours.config.is_hybrid
        ids = np.random.default_rng(0).integers(0, ours.config.vocab_size, (1, 12))
        got = ours.forward(ids, ours.new_cache())
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            want = hf(torch.from_numpy(ids)).logits.numpy()
        np.testing.assert_allclose(got, want, atol=ATOL_HF)


def test_the_trained_pair_decodes_losslessly(pair):
    args, _ = pair
    target = load_model(args.out / "target", "torch", threads=1)
    draft = load_model(args.out / "draft", "torch", threads=1)
    prompt = [100, 200, 300, 400, 500]

    def gen(method, d=None, **o):
        s = make_steps(method, target, d, prompt, max_new=N_NEW, sampling=GREEDY, seed=0, **o)
        return run(s, max_new=N_NEW).tokens

    ar = gen("ar")
    assert len(ar) == N_NEW
    assert gen("sd", draft, gamma=3) == ar


def test_resume_keeps_finished_stages(pair):
    args, _ = pair
    before = {n: (args.out / n / "model.safetensors").read_bytes() for n in ("target", "draft")}
    states = sorted(p.name for p in (args.out / ".resume").iterdir())
    assert states == ["draft.pt", "target.pt"]
    report = train_pair(TrainArgs(**{**vars(args), "resume": True}))
    assert "target" not in report["stages"] and report["stages"]["draft"]["resumed_done"]
    for n, data in before.items():
        assert (args.out / n / "model.safetensors").read_bytes() == data


# --- runtime.chat and apps.server on a tiny random hybrid pair (byte tokenizer) -------------

PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def hybrid_dirs(tiny_dir):
    return tiny_dir("qwen3_5_text", seed=1), tiny_dir("qwen3_5_text", num_layers=2, seed=2)


def ar_reference(target: Path, n: int) -> dict:
    from runtime.generate import build_parser, generate

    a = build_parser().parse_args(
        [
            "--target",
            str(target),
            "--method",
            "ar",
            "--prompt",
            PROMPT,
            "--max-tokens",
            str(n),
            "--json",
        ]
    )
    return generate(a)


def test_hybrid_chat_equals_generate_ar(hybrid_dirs):
    t, d = hybrid_dirs
    cmd = [sys.executable, "-m", "runtime.chat", "--target", str(t), "--draft", str(d),
           "--target-backend", "torch", "--draft-backend", "torch", "--method", "sd",
           "--gamma", "3", "--max-tokens", "12", "--temp", "0"]  # fmt: skip
    r = subprocess.run(
        cmd, input=PROMPT + "\n", capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert r.returncode == 0, r.stderr
    ref = ar_reference(t, 12)
    # the stream holds back a trailing incomplete UTF-8 sequence that decode() shows as U+FFFD
    assert r.stdout.endswith("\n") and ref["text"].startswith(r.stdout[:-1])
    # token for token, through the session runtime.chat drives
    tok = Tokenizer(t)
    s = ChatSession(
        load_model(t, "torch", threads=1),
        load_model(d, "torch", threads=1),
        tok,
        method="sd",
        gamma=3,
        max_tokens=12,
    )
    assert [x for toks in s.answer(PROMPT) for x in toks] == ref["tokens"]


def test_hybrid_server_equals_generate_ar(hybrid_dirs):
    pytest.importorskip("openai")
    t, d = hybrid_dirs
    args = ["--target", str(t), "--draft", str(d), "--target-backend", "torch",
            "--draft-backend", "torch", "--method", "sd", "--gamma", "3", "--api-key", "k",
            "--model-id", "m"]  # fmt: skip
    with served(args) as url:
        client = openai_client(url, "k")
        r = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0)
        ref = ar_reference(t, 12)
        assert r.choices[0].token_ids == ref["tokens"] and r.choices[0].text == ref["text"]
        assert r.usage.speculative["method"] == "sd"


# --- the hybrid benches: refusals as rows, the missing pair's command, replay vs redecode --


@pytest.fixture(scope="module")
def pair_root(hybrid_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("hybroot")
    (root / "target").symlink_to(hybrid_dirs[0])
    (root / "draft").symlink_to(hybrid_dirs[1])
    return root


def test_bench_rows_show_the_baselines_refusals(pair_root):
    pytest.importorskip("mlx_lm")
    from apps.bench.__main__ import build_parser
    from apps.bench.compare import bench
    from apps.bench.report import table

    a = build_parser().parse_args(
        [
            "--hybrid",
            str(pair_root),
            "--methods",
            "ar,sd,mlx-lm,hf-assisted",
            "--limit",
            "1",
            "--max-tokens",
            "6",
            "--temps",
            "0",
            "--no-warmup",
        ]
    )
    res = bench(a)
    assert res["settings"]["draft_backend"] == "onnx"  # where runtime.generate runs a draft
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["sd"]["matches_ar"] == "1/1" and rows["sd"]["tokens_per_s"] > 0
    assert "trimmable prompt cache" in rows["mlx-lm"]["refused"]
    assert "not supported with stateful models" in rows["hf-assisted"]["refused"]
    assert rows["mlx-lm"]["tokens_per_s"] is None and rows["hf-assisted"]["speedup"] is None
    text = table(res["rows"])
    assert "refused: mlx-lm: Speculative decoding requires a trimmable prompt cache" in text
    assert "refused: transformers: assisted generation is not supported" in text


@pytest.mark.parametrize("module", ["apps.bench", "apps.bench.studies.hybrid_rollback"])
def test_a_missing_pair_names_the_command(module, tmp_path):
    argv = [sys.executable, "-m", module, "--hybrid", str(tmp_path)]
    if module != "apps.bench":  # the default pair is out/hybrid; point it at an empty folder
        argv = [sys.executable, "-c", "import apps.bench.hybrid_pair as h, pathlib, sys; "
                f"h.DEFAULT_DIR = pathlib.Path({str(tmp_path)!r}); "
                "from apps.bench.studies.hybrid_rollback import main; "
                "sys.exit(main(['--sd']))"]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "python -m apps.train --arch qwen3_5 --out" in r.stderr


@pytest.mark.parametrize("draft_backend", ["onnx", "torch"])
def test_rollback_bench_end_to_end_replay_and_redecode_equal_ar(pair_root, draft_backend):
    from apps.bench.studies.hybrid_rollback import end_to_end

    res = end_to_end(
        pair_root / "target",
        pair_root / "draft",
        gamma=3,
        prompts=2,
        max_new=8,
        threads=1,
        draft_backend=draft_backend,
    )
    assert res["draft_backend"] == draft_backend
    for name in ("ar", "sd_replay", "sd_redecode", "sd_redecode_pass"):
        assert res[name]["equals_ar"] == "2/2" and res[name]["tokens"] > 0
    assert res["sd_replay_vs_redecode"] > 0
