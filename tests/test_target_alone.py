"""A target with no --draft: runtime.generate's default auto runs ar, or sd with a model-free
draft (devices/model_free_choice.py), with ar's tokens (it used to crash in the pair probe), and
apps.bench runs ar beside its peers alone (HF generate, mlx-lm generate_step)."""

from __future__ import annotations

import json

import pytest

QUESTIONS = [
    {"question_id": 1, "category": "code", "turns": ["def add(a, b):\n"]},
    {"question_id": 2, "category": "chat", "turns": ["hello"]},
]


def test_generate_with_a_target_alone_runs_ar_under_auto(tiny_dir, capsys):
    from runtime.generate import main

    t = tiny_dir("llama")
    assert main(["--target", str(t), "--prompt", "def f(x):", "--max-tokens", "8", "--json"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert len(res["tokens"]) == 8 and sum(res["stats"]["accept_lengths"]) == 8
    assert res["stats"]["auto"]["choice"] in ("ar", "sd") and res["stats"]["auto"]["alone"] is True
    # and the same tokens as --method ar
    assert (
        main(
            [
                "--target",
                str(t),
                "--prompt",
                "def f(x):",
                "--max-tokens",
                "8",
                "--json",
                "--method",
                "ar",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["tokens"] == res["tokens"]


def test_a_target_alone_gets_every_core(tiny_dir, monkeypatch):
    import os

    from runtime.loading import load_pair

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    pair = load_pair(str(tiny_dir("llama")), None, need_draft=False, target_backend="torch")
    assert pair.draft is None and pair.settings["target_threads"] == 4


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    return f


def test_bench_with_a_target_alone_runs_its_peers_alone(tiny_dir, prompts, capsys):
    from apps.bench.__main__ import main

    t = tiny_dir("qwen3")
    assert (
        main(
            [
                "--target",
                str(t),
                "--prompts",
                str(prompts),
                "--max-tokens",
                "6",
                "--temps",
                "0",
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    by = {r["method"]: r for r in res["rows"]}
    assert list(by) == ["ar", "hf", "mlx-lm"]
    for m in ("hf", "mlx-lm"):  # both peers, alone, give the target's own greedy tokens
        assert by[m]["matches_ar"] == "2/2" and by[m]["mean_accepted"] == 1.0
    assert res["settings"]["model_id"] == t.name


def test_bench_refuses_a_drafting_method_for_a_target_alone(tiny_dir, prompts, capsys):
    from apps.bench.__main__ import main

    rc = main(["--target", str(tiny_dir("qwen3")), "--prompts", str(prompts), "--methods", "ar,sd"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--methods sd needs a draft" in err and len(err.splitlines()) == 1


def test_footprint_runs_ar_and_hf_each_in_its_own_process(tiny_dir, capsys):
    from apps.bench.__main__ import main

    t = tiny_dir("llama")
    assert (
        main(["footprint", "--target", str(t), "--rounds", "1", "--max-tokens", "4", "--json"]) == 0
    )
    res = json.loads(capsys.readouterr().out)
    rows = {r["runner"]: r for r in res["rows"]}
    assert set(rows) == {"hf", "duet:torch"}
    assert rows["duet:torch"]["equals_hf"] is True  # greedy: the target's own tokens either way
    assert rows["hf"]["tok_s_vs_hf"] == 1.0 and rows["duet:torch"]["peak_rss_mb"] > 0
