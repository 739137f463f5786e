"""`python -m apps.bench --gammas` and `--exit-head` on a tiny pair: every γ-taking method runs
once per γ (METHOD@gG), ar and tree once, extra --drafts load once, greedy rows equal ar's
tokens; bad values are one line, exit 2."""

from __future__ import annotations

import json

import pytest

from apps.bench import drafts
from apps.bench.__main__ import main
from apps.bench.args import parse_gammas
from apps.bench.report import base_method, partner, table
from runtime.errors import DuetError

QUESTIONS = [
    {"question_id": 1, "category": "code", "turns": ["def add(a, b):\n"]},
    {"question_id": 2, "category": "code", "turns": ["import os\n"]},
]


@pytest.fixture(scope="module")
def base(tiny_dir, tmp_path_factory):
    """The target as its own draft (everything accepted, so γ shows in the accepted length),
    and a random 1-layer draft as --drafts (almost nothing accepted: the rollback path)."""
    t = tiny_dir("qwen3")
    other = tiny_dir("qwen3", num_layers=1, seed=1)
    prompts = tmp_path_factory.mktemp("gammas") / "q.jsonl"
    prompts.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    argv = ["--target", str(t), "--draft", str(t), "--draft-backend", "torch", "--prompts",
            str(prompts), "--max-tokens", "8", "--temps", "0", "--no-warmup", "--json"]  # fmt: skip
    return argv, other


def _run(argv, capsys) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_sweep_runs_each_gamma_and_stays_lossless(base, capsys, monkeypatch):
    argv, other = base
    loads = []
    real = drafts.extra_pair
    monkeypatch.setattr(drafts, "extra_pair", lambda *x: loads.append(x[1]) or real(*x))
    res = _run(
        [
            *argv,
            "--methods",
            "ar,sd,mirror,tree",
            "--gammas",
            "2,3",
            "--drafts",
            str(other),
            "--exit-head",
            "raw",
        ],
        capsys,
    )
    tag = other.name
    assert [r["method"] for r in res["rows"]] == [
        "ar",
        "sd@g2",
        "mirror@g2",
        "tree",
        f"sd+{tag}@g2",
        f"mirror+{tag}@g2",
        f"tree+{tag}",
        "sd@g3",
        "mirror@g3",
        f"sd+{tag}@g3",
        f"mirror+{tag}@g3",
    ]
    assert loads == [str(other)]  # the extra draft is loaded once for both γ
    assert res["mismatches"] == [] and all(r["matches_ar"] == "2/2" for r in res["rows"])
    by = {r["method"]: r for r in res["rows"]}
    # self-draft, greedy, 8 tokens: γ=2 commits 3 + 3 + 2 per prompt, γ=3 commits 4 + 4
    assert by["sd@g2"]["mean_accepted"] == pytest.approx(8 / 3, abs=1e-3)
    assert by["sd@g3"]["mean_accepted"] == 4.0
    runners = res["settings"]["threads"]["runners"]
    assert runners["sd@g2"]["gamma"] == 2 and runners[f"mirror+{tag}@g3"]["gamma"] == 3
    assert all(runners[m]["exit_head"] == "raw" for m in runners if m.startswith("mirror"))
    assert res["settings"]["gammas"] == [2, 3]
    # each mirror row against the sd row of its own draft and γ; sd's drafting share per row
    for m in ("mirror@g2", f"mirror+{tag}@g3"):
        sd = by[m.replace("mirror", "sd", 1)]
        assert by[m]["vs_sd"] == round(by[m]["tokens_per_s"] / sd["tokens_per_s"], 3)
    assert "vs_sd" not in by["tree"]  # no plain `sd` row in a sweep to compare it with
    assert all("draft_share" in by[m] for m in by if m.startswith("sd"))
    notes = table(res["rows"]).splitlines()
    assert any(n.startswith("temp 0: sd@g3 drafts") and "(measured mirror@g3:" in n for n in notes)


def test_runner_names():
    assert [base_method(n) for n in ("sd", "sd+mtp", "sd@g4", "mirror+d@g2")] == [
        "sd",
        "sd",
        "sd",
        "mirror",
    ]
    assert partner("mirror+d@g2", "mirror", "sd") == "sd+d@g2"
    assert partner("heterospec", "heterospec", "tree") == "tree"
    assert partner("sd@g2", "mirror", "sd") is None


def test_one_gamma_keeps_the_plain_names(base, capsys):
    argv, _ = base
    res = _run([*argv, "--methods", "ar,sd", "--gammas", "3"], capsys)
    assert [r["method"] for r in res["rows"]] == ["ar", "sd"]
    assert res["settings"]["gammas"] == [3] and res["rows"][1]["mean_accepted"] == 4.0


def test_methods_without_gamma_run_once(base, capsys):
    argv, other = base
    res = _run([*argv, "--methods", "ar,tree", "--gammas", "2,3", "--drafts", str(other)], capsys)
    assert [r["method"] for r in res["rows"]] == ["ar", "tree", f"tree+{other.name}"]


def test_exit_head_reaches_mirror(base, capsys):
    argv, _ = base
    # the tiny target has no tuned exit head stored: asking for one is mirror's own refusal
    assert main([*argv, "--methods", "ar,mirror", "--exit-head", "tuned"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--exit-head tuned: no tuned exit head" in err[0], err


def test_parse_gammas():
    assert parse_gammas(None, 4) == [4]
    assert parse_gammas("3, 1,3", 4) == [3, 1]  # distinct, in the order given
    for bad in ("0", "2,-1", "a", "1.5", "", ","):
        with pytest.raises(DuetError, match="--gammas"):
            parse_gammas(bad, 4)


@pytest.mark.parametrize("value", ["0", "2,x", ""])
def test_bad_gammas_is_one_line_exit_2(value, capsys, tmp_path):
    # no --target: the check comes before any model (or the embedded pair) loads
    assert main(["--methods", "ar,sd", "--gammas", value, "--prompts", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gammas" in err[0], err


def test_an_extra_draft_is_emulated_with_the_pair_under_emulate(base, capsys, monkeypatch):
    """--drafts under --emulate: the extra draft's stages are padded and counted like the
    pair's (before, it ran unpadded beside an emulated target); the MTP head is refused."""
    from devices.emulated_model import EmulatedModel

    argv, other = base
    made = []
    real = drafts.extra_pair
    monkeypatch.setattr(drafts, "extra_pair", lambda *x: made.append(real(*x)) or made[-1])
    res = _run(
        [
            *argv,
            "--methods",
            "ar,sd",
            "--drafts",
            str(other),
            "--emulate",
            "m3-max",
            "--max-tokens",
            "4",
        ],
        capsys,
    )
    assert isinstance(made[0].draft, EmulatedModel) and made[0].draft.role == "draft"
    assert [r["method"] for r in res["rows"]] == ["ar", "sd", f"sd+{other.name}"]
    assert all(r["emulated"] == res["emulated"] for r in res["rows"])
    drafted = res["settings"]["emulation"]["stages"]["draft"]["count"]
    mine = [r for r in made[0].draft.emu.records if r.role == "draft"]
    assert 0 < len(mine) == drafted  # one shared list: the summary counts both drafts' stages
    assert any(r.role == "target" for r in made[0].draft.emu.records)
    assert main([*argv, "--methods", "ar,sd", "--drafts", "mtp", "--emulate", "m3-max"]) == 2
    assert "cannot be emulated" in capsys.readouterr().err


def test_sampled_mirror_rows_report_how_many_turns_share_sds_texts(base, capsys):
    """At T > 0 sd and mirror at one γ and seed draw from the same keyed streams: the bench
    says in how many turns their answers are the same tokens (all, on this pair, with a draft
    that is often rejected); a turn that differs is counted out."""
    from apps.bench.report import summarize

    argv, other = base
    argv = [a if a != "0" else "1" for a in argv]  # --temps 1
    res = _run([*argv, "--methods", "ar,sd,mirror", "--gamma", "2", "--drafts", str(other)], capsys)
    by = {r["method"]: r for r in res["rows"]}
    tag = other.name
    assert by[f"mirror+{tag}"]["same_texts_as_sd"] == "2/2"
    assert by["mirror"]["same_texts_as_sd"] == "2/2"
    assert "same_texts_as_sd" not in by[f"sd+{tag}"]
    notes = table(res["rows"]).splitlines()
    assert any("the same texts in 2/2 turns" in n for n in notes)
    rec = {"temp": 1.0, "question_id": 1, "new_tokens": [2, 2], "wall_time": [1.0, 1.0],
           "accept_lengths": [1, 1], "note": None, "matches_ar": None}  # fmt: skip
    records = [rec | {"method": "sd", "tokens": [[1, 2], [3, 4]]},
               rec | {"method": "mirror", "tokens": [[1, 2], [3, 5]]}]  # fmt: skip
    rows = summarize(records, ["sd", "mirror"], [1.0])
    assert rows[1]["same_texts_as_sd"] == "1/2"
    again = [r | {"sample": 1, "tokens": [[7], [8]]} for r in records]  # a second draw, the same
    rows = summarize(records + again, ["sd", "mirror"], [1.0])
    assert rows[1]["same_texts_as_sd"] == "3/4"  # every draw counted, each against its own
