"""apps.bench.studies.copy_bound: the longest copies and the cheapest schedule match brute force,
and the command bounds a tiny ONNX target's turns."""

import itertools
import json
import random

import pytest

from apps.bench.studies.copy_bound import copy_lengths, fastest_steps, main
from runtime.errors import DuetError


def _brute_lengths(context, answer, cap):
    out = []
    for i in range(len(answer)):
        text = context + answer[:i]
        runs = {tuple(text[a:b]) for a in range(len(text)) for b in range(a + 1, len(text) + 1)}
        out.append(
            max(
                [
                    n
                    for n in range(1, cap + 1)
                    if tuple(answer[i : i + n]) in runs and i + n <= len(answer)
                ]
                or [0]
            )
        )
    return out


def test_copy_lengths_match_brute_force_on_random_strings():
    rng = random.Random(3)
    for _ in range(60):
        alphabet = rng.randint(2, 5)
        ctx = [rng.randrange(alphabet) for _ in range(rng.randint(0, 12))]
        ans = [rng.randrange(alphabet) for _ in range(rng.randint(1, 14))]
        cap = rng.randint(1, 6)
        assert copy_lengths(ctx, ans, cap) == _brute_lengths(ctx, ans, cap), (ctx, ans, cap)


def test_fastest_steps_is_the_cheapest_of_every_schedule():
    rng = random.Random(5)
    for _ in range(40):
        n = rng.randint(1, 8)
        lens = [rng.randint(0, 3) for _ in range(n)]
        cost = {k: 1.0 + 0.37 * (k - 1) + rng.random() * 0.1 for k in range(1, 5)}
        cost = {k: max(cost[j] for j in range(1, k + 1)) for k in cost}  # nondecreasing
        best = float("inf")
        for ks in itertools.product(range(1, 5), repeat=n):  # every split into steps
            i, s = 0, 0.0
            for k in ks:
                if i == n:
                    break
                if k > lens[i] + 1 or i + k > n:
                    s = float("inf")
                    break
                s, i = s + cost[k], i + k
            if i == n:
                best = min(best, s)
        got, steps = fastest_steps(lens, cost.__getitem__)
        assert abs(got - best) < 1e-9 and 1 <= steps <= n
    assert fastest_steps([0, 0, 0], lambda k: 1.0) == (3.0, 3)  # nothing to copy: ar's steps
    assert fastest_steps([2, 1, 0], lambda k: 1.0)[1] == 1  # one 3-token pass


def test_the_command_bounds_a_tiny_targets_turns(tiny_dir, tmp_path, capsys):
    d = tiny_dir("qwen2", num_layers=2, seed=5)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"category": c, "turns": [t]}) + "\n"
            for c, t in (
                ("summarization", "the cat sat on the mat. " * 6),
                ("qa", "why is the sky blue?"),
            )
        )
    )
    assert (
        main(
            [
                "--target",
                str(d),
                "--prompts",
                str(prompts),
                "--max-tokens",
                "12",
                "--max-window",
                "3,5",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]  # progress goes to stderr
    assert set(rows) == {"summarization", "qa", "all"}
    for r in rows.values():
        assert 0 < r["prefill_share"] < 1
        # k = 1 is always open (ar's own steps), a wider window only adds choices, and a draft
        # whose every token is accepted is at least as fast as the best copy
        assert 1 - 1e-9 <= r["bound_speedup_w3"] <= r["bound_speedup_w5"] + 1e-9
        assert r["bound_speedup_w5"] <= r["any_draft_speedup_w5"] + 1e-9
    with pytest.raises(DuetError, match="at least 2"):
        main(["--target", str(d), "--max-window", "1"])
