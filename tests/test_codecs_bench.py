"""`python -m apps.bench.codecs` runs end to end on the embedded pair (a tiny slice) and its
wire bits match the codecs' bit model up to the byte padding of each payload."""

import json

from apps.bench import codecs as bench


def test_codecs_bench_smoke(capsys):
    assert bench.main(["--limit", "1", "--max-len", "10", "--temps", "1.0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    row = r["temps"]["1.0"]
    for name in ("k-sqs", "c-sqs", "cu-hlm"):
        c = row[name]
        assert 0 <= c["bits_per_token"] - c["model_bits_per_token"] < 8  # padding only
        assert 0 < c["acceptance"] <= 1
    assert row["c-sqs"]["theorem2"]["met"]


def test_codecs_bench_bad_input(capsys):
    assert bench.main(["--temps", "hot"]) == 2
    assert "expected comma-separated numbers" in capsys.readouterr().err
