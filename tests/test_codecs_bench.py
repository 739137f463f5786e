"""`python -m apps.bench.studies.uplink_codecs` runs end to end on the embedded pair (a tiny
slice) and its wire bits match the codecs' bit model up to the byte padding of each payload."""

import json

from apps.bench.studies import uplink_codecs as bench


def test_codecs_bench_smoke(capsys):
    assert bench.main(["--limit", "1", "--max-len", "10", "--temps", "1.0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    row = r["temps"]["1.0"]
    for name in ("k-sqs", "c-sqs", "cu-hlm"):
        c = row[name]
        assert 0 <= c["bits_per_token"] - c["model_bits_per_token"] < 8  # padding only
        assert 0 < c["acceptance"] <= 1
    assert row["c-sqs"]["theorem2"]["met"]
    off = row["cu-hlm-offline"]  # eq. (21)'s k*, fitted on the first half, coded on the second
    assert 1 <= off["k_star"] < r["vocab"]
    assert 0 <= off["bits_per_token"] - off["model_bits_per_token"] < 8
    assert 0 < off["acceptance"] <= 1 and 0 < off["acceptance_raw_same_rows"] <= 1


def test_cuhlm_offline_k_star_follows_theta():
    """A looser tolerance theta never asks for more tokens (eq. 21 is a min over a threshold)."""
    import numpy as np

    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.full(64, 0.3), size=20).astype(np.float32)
    p = rng.dirichlet(np.full(64, 0.3), size=20).astype(np.float32)
    ks = [bench.run_cuhlm_offline(p, q, th, 4, rng)["k_star"] for th in (0.05, 0.2, 0.8)]
    assert ks[0] >= ks[1] >= ks[2] and ks[0] > ks[2]


def test_codecs_bench_bad_input(capsys):
    assert bench.main(["--temps", "hot"]) == 2
    assert "must be comma-separated numbers" in capsys.readouterr().err


def test_modeled_latency_per_link(tmp_path, capsys):
    """--links: each codec's MODELED ms/token is the link's RTT plus gamma rows' bits over its
    rate, per geometric expected tokens; --plot writes both of SQS Fig. 2's panels."""
    from devices.latency import expected_accepted
    from devices.links import LINKS

    out = tmp_path / "x.html"
    argv = ["--limit", "1", "--max-len", "10", "--temps", "0.5,1.0", "--links", "4g", "--json",
            "--gamma", "3", "--plot", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    c = r["temps"]["1.0"]["c-sqs"]
    m, link = c["modeled"]["4g"], LINKS["4g"]
    want = 1e3 * (link.rtt_s + 3 * c["bits_per_token"] / link.rate_bps)
    assert abs(m["ms_per_token"] - want / expected_accepted(3, c["acceptance"], "geometric")) < 1e-6
    assert abs(m["resample_rate"] - (1 - c["acceptance"] ** 3)) < 1e-9
    html = out.read_text()
    assert html.count("<svg") == 2 and "4g" in html and "MODELED" in html
    assert bench.main(["--links", "moon"]) == 2
    assert "unknown link 'moon'" in capsys.readouterr().err
