"""apps.train: the training program on a tiny corpus, its parts, and the committed outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from apps.train.__main__ import main as train_main
from apps.train.configs import DRAFT, MAX_DRAFT_RATIO, TARGET, compute_summary
from apps.train.corpus import load_corpus, split_files
from apps.train.evaluate import accepted_lengths
from apps.train.prompts import CATEGORIES, build_prompts, read_prompts
from apps.train.tokenizer import EOS, load_tokenizer, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PAIR = ROOT / "runtime" / "assets" / "default"
PROMPTS = ROOT / "apps" / "prompts" / "heldout.jsonl"

MODULE = '''"""Module {i}: helpers for shapes."""

import math
import os
import sys


def area_{i}(width, height):
    """Return the area of a {i}-rectangle."""
    total = width * height
    return total + {i}


class Shape{i}:
    """A shape with {i} sides."""

    def __init__(self, size):
        self.size = size

    def perimeter(self):
        """Return the perimeter.

        >>> Shape{i}(2).perimeter()
        {p}
        """
        # multiply the size by the number of sides here
        return self.size * {i}


TABLE_{i} = {{
    "a": {i},
    "b": {i} + 1,
    "c": {i} + 2,
    "d": {i} + 3,
    "e": {i} + 4,
    "f": {i} + 5,
}}
'''


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    for i in range(3, 15):
        sub = d / ("pkg" if i % 2 else "") / f"mod{i}.py"
        sub.parent.mkdir(exist_ok=True)
        sub.write_text(MODULE.format(i=i, p=2 * i) * 3)
    (d / "README.txt").write_text("not python, not included by default\n")
    return d


TINY = [
    "--vocab-size",
    "300",
    "--seq-len",
    "64",
    "--batch-size",
    "8",
    "--target-shape",
    "64,2,128,4,2,16",
    "--draft-shape",
    "32,1,64,2,1,16",
    "--allow-draft-over-budget",
    "--target-steps",
    "40",
    "--draft-steps",
    "30",
    "--target-lr",
    "3e-3",
    "--draft-lr",
    "3e-3",
    "--warmup",
    "5",
    "--log-every",
    "5",
    "--ckpt-every",
    "20",
    "--heldout-frac",
    "0.25",
    "--eval-prompts",
    "4",
    "--eval-max-new-tokens",
    "8",
]


@pytest.fixture(scope="module")
def trained(tiny_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair")
    assert train_main(["--out", str(out), "--corpus", str(tiny_corpus), *TINY]) == 0
    return out


def test_losses_fall(trained):
    log = [json.loads(line) for line in (trained / "loss_log.jsonl").read_text().splitlines()]
    for stage in ("target", "draft"):
        recs = [r for r in log if r["stage"] == stage and "loss" in r]
        assert recs[-1]["loss"] < 0.8 * recs[0]["loss"], (stage, recs[0]["loss"], recs[-1]["loss"])
    assert any("heldout_loss_quick" in r for r in log)  # checkpoint evaluations are logged


def test_saved_pair_loads_with_transformers(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = load_tokenizer(trained / "target")
    eos = tok.token_to_id(EOS)
    vocabs = []
    for name in ("target", "draft"):
        d = trained / name
        assert {
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        } <= {p.name for p in d.iterdir()}
        model = AutoModelForCausalLM.from_pretrained(d)
        assert model.config.model_type == "qwen3"
        assert model.config.eos_token_id == eos
        assert model.config.vocab_size == tok.get_vocab_size()
        assert AutoTokenizer.from_pretrained(d).eos_token_id == eos
        vocabs.append(load_tokenizer(d).get_vocab())
    assert vocabs[0] == vocabs[1]
    assert (
        json.loads((trained / "draft" / "config.json").read_text())["tie_word_embeddings"] is True
    )


def test_report_and_split(trained, tiny_corpus):
    rep = json.loads((trained / "training_report.json").read_text())
    assert rep["steps"] == {"target": 40, "draft": 30}
    ev = rep["evaluation"]
    assert ev["target_heldout_loss"] > 0 and ev["draft_heldout_loss"] > 0
    assert 0.0 <= ev["greedy_acceptance"] <= 1.0 and ev["positions"] > 0
    assert rep["stages"]["target"]["reload_check"]["argmax_agree"] > 0.9
    split = json.loads((trained / "split.json").read_text())
    held = set(split["heldout"])
    assert held and split["train_files"] + len(held) == 12
    assert all(f.endswith(".py") for f in held)


def test_tokenizer_round_trips(tiny_corpus):
    tok = train_tokenizer([p.read_text() for p in sorted(tiny_corpus.rglob("*.py"))], 300)
    for text in ("def f(x):\n\treturn x  # ü, é, 漢字\n\n", "  leading spaces", "", "\x00\xff"):
        assert tok.decode(tok.encode(text).ids) == text
    assert tok.token_to_id(EOS) == 0


def test_split_is_by_whole_file_and_order_free():
    files = [f"pkg/m{i}.py" for i in range(200)]
    train, held = split_files(files, 0.1)
    assert set(train) | set(held) == set(files) and not set(train) & set(held)
    assert 5 <= len(held) <= 40
    assert split_files(list(reversed(files)), 0.1) == (train, held)
    assert split_files(files + ["new.py"], 0.1)[1] in (held, sorted(held + ["new.py"]))


def test_prompts_come_from_heldout_files_only(tiny_corpus):
    corpus = load_corpus(tiny_corpus, heldout_frac=0.25)
    recs = build_prompts(corpus, per_category=3)
    assert recs and all(r["source"].split(":")[0] in corpus.heldout for r in recs)
    assert [r["question_id"] for r in recs] == list(range(1, len(recs) + 1))
    assert build_prompts(corpus, per_category=3) == recs  # deterministic


def test_accepted_lengths():
    T, F = True, False
    assert accepted_lengths([T, T, F, T, T, T, T, T], gamma=4) == [2, 4]  # last T: the bonus token
    assert accepted_lengths([T, T, F, T, T, T, T, T, F], gamma=4) == [2, 4, 0]
    assert accepted_lengths([F, F], gamma=4) == [0, 0]
    assert accepted_lengths([], gamma=4) == []


def test_default_shapes_meet_the_budget():
    s = compute_summary(TARGET, DRAFT, 4096)
    assert 15e6 <= s["target_params"] <= 40e6
    assert s["draft_target_flop_ratio"] <= MAX_DRAFT_RATIO


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--corpus", "EMPTY"], "no files matching"),
        (["--corpus", "MISSING"], "does not exist"),
        (["--target-steps", "0", "--draft-steps", "1"], "must be positive"),
        ([], "give --target-steps"),
    ],
)
def test_bad_arguments_give_one_line(tmp_path, capsys, extra, needle):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hello")
    extra = [
        str(tmp_path / "empty") if e == "EMPTY" else str(tmp_path / "nope") if e == "MISSING" else e
        for e in extra
    ]
    steps = (
        []
        if "--target-steps" in extra or not extra
        else ["--target-steps", "1", "--draft-steps", "1"]
    )
    assert train_main(["--out", str(tmp_path / "out"), *extra, *steps]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_bad_corpus_exits_nonzero_without_traceback(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "apps.train",
            "--out",
            str(tmp_path / "o"),
            "--corpus",
            str(tmp_path),
            "--target-steps",
            "1",
            "--draft-steps",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "no files matching" in r.stderr and "Traceback" not in r.stderr


def test_committed_prompt_set():
    recs = read_prompts(PROMPTS)
    assert len(recs) >= 40
    assert len({r["category"] for r in recs}) >= 5 and {r["category"] for r in recs} <= set(
        CATEGORIES
    )
    assert len({r["question_id"] for r in recs}) == len(recs)
    assert all(isinstance(r["turns"], list) and r["turns"][0].strip() for r in recs)
    split = DEFAULT_PAIR / "split.json"
    if split.is_file():
        held = set(json.loads(split.read_text())["heldout"])
        assert all(r["source"].split(":")[0] in held for r in recs)


def _shipped(p) -> bool:
    """A file of the pair, not a cache made on the fly (git ignores `.duet/`; its ONNX exports
    and resumable training state are rebuilt, a fitted MTP head there is committed)."""
    return p.is_file() and not (
        ".duet" in p.parts and (p.suffix == ".onnx" or ".resume" in p.parts)
    )


def test_committed_default_pair():
    size = sum(p.stat().st_size for p in DEFAULT_PAIR.rglob("*") if _shipped(p))
    assert size <= 60e6, f"runtime/assets/default is {size / 1e6:.1f} MB"
    t, d = load_tokenizer(DEFAULT_PAIR / "target"), load_tokenizer(DEFAULT_PAIR / "draft")
    assert t.get_vocab() == d.get_vocab()
    eos = t.token_to_id(EOS)
    for name in ("target", "draft"):
        cfg = json.loads((DEFAULT_PAIR / name / "config.json").read_text())
        assert cfg["model_type"] == "qwen3" and cfg["eos_token_id"] == eos
        assert cfg["vocab_size"] == t.get_vocab_size()
    rep = json.loads((DEFAULT_PAIR / "training_report.json").read_text())
    assert rep["draft_target_flop_ratio"] <= MAX_DRAFT_RATIO


def test_evaluate_command_updates_report(trained, tiny_corpus, capsys):
    from apps.train.evaluate import main as evaluate_main

    args = [str(trained), "--max-prompts", "2", "--max-new-tokens", "4", "--write-report"]
    assert evaluate_main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    rep = json.loads((trained / "training_report.json").read_text())
    assert rep["evaluation"] == printed and printed["prompts"] == 2


def test_help_explains(capsys):
    with pytest.raises(SystemExit) as e:
        train_main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--time-budget-min" in out and "--corpus" in out and "distil" in out
