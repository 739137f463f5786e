"""apps.bench peers: rows against each peer's own ar, skip messages, the HF prompt-lookup peer,
llama.cpp's response reading, the per-category table and the schedule's round order (mocks and
tiny checkpoints; no timing)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from apps.bench.categories import by_category, category_table
from apps.bench.prompt_set import load_prompts
from apps.bench.report import mismatches, summarize
from apps.bench.runners.llamacpp import even_lengths, ngram_modes, spec_types, turn_from_response
from apps.bench.runners.peers import parse_peers, peer_runners
from apps.bench.runners.turn import TurnResult
from apps.bench.schedule import run_bench
from runtime.errors import DuetError


class FakeTok:
    def encode(self, text):
        return [ord(c) % 200 for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


class Fake:
    """A runner answering a fixed token list at `rate` tok/s, `per_step` tokens a step."""

    def __init__(self, name, tokens, wall, per_step=1, own_ar=None):
        self.name, self.tokens, self.wall, self.per_step = name, tokens, wall, per_step
        if own_ar:
            self.own_ar = own_ar

    def settings(self):
        return {}

    def generate(self, ids, max_new, temp, top_p, seed):
        toks = self.tokens[:max_new]
        return TurnResult(toks, self.wall, even_lengths(len(toks), -(-len(toks) // self.per_step)))


QS = [
    {"question_id": 1, "category": "summarization", "turns": ["abc"]},
    {"question_id": 2, "category": "rag", "turns": ["def"]},
    {"question_id": 3, "category": "summarization", "turns": ["ghi"]},
]


def bench(runners, recs=QS, **kw):
    return run_bench(
        runners,
        recs,
        FakeTok(),
        None,
        temps=[0.0],
        top_p=1.0,
        max_new=8,
        seed=0,
        context=64,
        warmup=False,
        **kw,
    )


def test_each_round_rotates_the_runner_order():
    calls = []

    class Recording(Fake):
        def generate(self, *args):
            calls.append(self.name)
            return super().generate(*args)

    bench([Recording("a", [1], 0.01), Recording("b", [1], 0.01)], recs=QS[:1], rounds=2)
    assert calls == ["a", "b", "b", "a"]


def test_rows_are_against_each_peers_own_ar():
    runners = [
        Fake("ar", [5, 6, 7, 8], 1.0),
        Fake("sd", [5, 6, 7, 8], 0.5, per_step=2),
        Fake("llama.cpp:ar", [1, 2, 3, 4], 0.1, own_ar="llama.cpp:ar"),
        Fake("llama.cpp:ngram-simple", [1, 2, 3, 4], 0.05, per_step=4, own_ar="llama.cpp:ar"),
        Fake("hf:lookup", [1, 2, 9, 9], 0.4, own_ar="hf:ar"),
        Fake("hf:ar", [1, 2, 3, 4], 0.8, own_ar="hf:ar"),
    ]
    recs = bench(runners)
    own = {r.name: getattr(r, "own_ar", "ar") for r in runners}
    rows = {r["method"]: r for r in summarize(recs, [r.name for r in runners], [0.0], own)}
    assert rows["sd"]["speedup"] == 2.0 and rows["sd"]["matches_ar"] == "3/3"
    assert rows["llama.cpp:ar"]["speedup"] == 1.0  # its own baseline, not Duet's ar
    assert rows["llama.cpp:ngram-simple"]["speedup"] == 2.0
    assert rows["llama.cpp:ngram-simple"]["mean_accepted"] == 4.0
    assert rows["llama.cpp:ngram-simple"]["matches_ar"] == "3/3"  # llama.cpp's ar's tokens
    assert rows["hf:lookup"]["speedup"] == 2.0 and rows["hf:lookup"]["matches_ar"] == "0/3"
    (m,) = {(x["method"], x["own_ar"], x["first_diff"]) for x in mismatches(recs)}
    assert m == ("hf:lookup", "hf:ar", 2)


def test_per_category_table():
    runners = [Fake("ar", [5, 6, 7, 8], 1.0), Fake("sd", [5, 6, 7, 8], 0.5, per_step=2)]
    per = by_category(bench(runners), ["ar", "sd"], [0.0])
    assert list(per) == ["summarization", "rag", "overall"]
    assert [r["prompts"] for r in per["summarization"]] == [2, 2]
    text = category_table(per, 0.0)
    lines = text.splitlines()
    assert lines[0].startswith("per category, temp 0")
    assert lines[1].split() == [
        "method",
        "Summarization",
        "RAG",
        "tok/step",
        "Overall",
        "tok/s",
        "=",
        "own",
        "ar",
    ]
    assert lines[4].split() == ["sd", "2.00x", "2.00x", "2.00", "2.00x", "8.0", "3/3"]


def test_llamacpp_response_and_lengths():
    r = {"tokens": [4, 5, 6, 7, 8], "stop_type": "eos",
         "timings": {"draft_n": 6, "draft_n_accepted": 3,
                     "predicted_per_second": 99.0}}  # fmt: skip
    rates = []
    t = turn_from_response(r, 0.2, (2,), rates)
    assert t.tokens == [4, 5, 6, 7, 8, 2]  # the EOS the server stopped at, counted as Duet does
    assert t.accept_lengths == [2, 2, 2] and rates == [99.0]  # 6 tokens, 3 accepted: 3 passes
    assert even_lengths(7, 3) == [3, 2, 2] and even_lengths(2, 9) == [1, 1]
    assert even_lengths(0, 3) == []


def test_llamacpp_spec_types_read_from_help(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text(
        "#!/bin/sh\necho '--spec-type none,draft-simple,ngram-simple,ngram-mod,x  "
        "comma-separated'\n"
    )
    fake.chmod(0o755)
    spec_types.cache_clear()
    assert ngram_modes(str(fake)) == ["ngram-simple", "ngram-mod"]


def args(**kw):
    return SimpleNamespace(gguf=None, gguf_draft=None, gamma=4, **kw)


def test_skip_messages(tmp_path, monkeypatch, tiny_dir):
    ckpt = tiny_dir("llama")
    pair = SimpleNamespace(
        target_dir=Path(ckpt), target=SimpleNamespace(config=SimpleNamespace(eos_token_ids=[2]))
    )
    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path))  # no llama-server built there
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # import fails
    monkeypatch.setitem(sys.modules, "mlx_lm", None)
    runners, skipped = peer_runners(["llama.cpp", "ort-genai", "mlx-lm"], pair, args(), 2)
    assert runners == []
    assert "python -m apps.bench.runners.llamacpp_server build" in skipped["llama.cpp:ar"]
    assert "pip install onnxruntime-genai" in skipped["ort-genai:ar"]
    assert "mlx-lm is not importable" in skipped["mlx-lm:ar"]
    with pytest.raises(DuetError, match="unknown nope"):
        parse_peers("hf,nope")
    assert parse_peers("all") == ["llama.cpp", "ort-genai", "hf", "mlx-lm"]


def test_hf_prompt_lookup_equals_hf_ar(tiny_dir):
    ckpt = tiny_dir("llama")
    pair = SimpleNamespace(
        target_dir=Path(ckpt),
        draft_path=None,
        target=SimpleNamespace(config=SimpleNamespace(eos_token_ids=[])),
    )
    runners, skipped = peer_runners(["hf"], pair, args(), 1)
    assert [r.name for r in runners] == ["hf:ar", "hf:lookup"] and not skipped
    assert runners[1].target is runners[0].target  # one load, shared
    p = [7, 8, 9, 10, 11, 12]
    ids = p + runners[0].generate(p, 16, 0.0, 1.0, 0).tokens + [5] + p  # n-grams to look up
    ar, lk = (r.generate(ids, 24, 0.0, 1.0, 0) for r in runners)
    assert lk.tokens == ar.tokens and len(ar.tokens) == 24
    assert ar.accept_lengths == [1] * 24  # one token a pass alone
    assert sum(lk.accept_lengths) == 24  # one entry per target pass


def test_per_category_limit():
    recs = load_prompts("chat", per_category=1)
    cats = [r["category"] for r in recs]
    assert len(cats) == len(set(cats)) == 6
    assert len(load_prompts("chat", per_category=2)) == 12
    with pytest.raises(DuetError, match="per-category-limit"):
        load_prompts("chat", per_category=0)


def test_cli_rows_categories_and_skips(tiny_dir, tmp_path, monkeypatch, capsys):
    import json

    from apps.bench.__main__ import main

    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path / "cache"))  # no llama-server there
    qs = tmp_path / "q.jsonl"
    qs.write_text("\n".join(json.dumps(q) for q in QS) + "\n")
    out = tmp_path / "res.json"
    argv = ["--target", str(tiny_dir("llama")), "--methods", "ar", "--peers", "llama.cpp,hf",
            "--prompts", str(qs), "--per-category-limit", "1", "--max-tokens", "6",
            "--temps", "0", "--threads", "1", "--no-warmup", "--json-out", str(out)]  # fmt: skip
    assert main(argv) == 0
    res = json.loads(out.read_text())
    rows = {r["method"]: r for r in res["rows"]}
    assert list(rows) == ["ar", "hf:ar", "hf:lookup"]
    assert rows["hf:lookup"]["matches_ar"] == "2/2"  # against hf:ar, one prompt per category
    assert list(res["categories"]) == ["summarization", "rag", "overall"]
    assert "apps.bench.runners.llamacpp_server build" in res["settings"]["skipped"]["llama.cpp:ar"]
    text = capsys.readouterr().out
    assert "skipped llama.cpp:ar: llama-server is not built here" in text


def test_second_target_backend_rows(tiny_dir, tmp_path):
    import json

    from apps.bench.__main__ import main

    qs = tmp_path / "q.jsonl"
    qs.write_text(json.dumps(QS[0]) + "\n")
    out = tmp_path / "res.json"
    argv = ["--target", str(tiny_dir("llama")), "--target-backend", "torch", "--draft", "lookup",
            "--methods", "ar,sd", "--also-target-backend", "onnx", "--quantize", "none",
            "--prompts", str(qs), "--max-tokens", "6", "--temps", "0", "--threads", "1",
            "--no-warmup", "--json-out", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["ar", "sd+lookup", "onnx:ar", "onnx:sd+lookup"]
    assert rows["onnx:sd+lookup"]["matches_ar"] == "1/1"  # against onnx:ar, its own target
    assert rows["onnx:ar"]["speedup"] == 1.0
