"""HeteroSpec bins: the CART fit gives 8 bins ordered by Φ that follow a step-shaped TCR,
refitting from saved paths runs no model, a bad file is one clear line, and the shipped
bins of the embedded pair load."""

import json

import numpy as np

from apps.train.bins import fit_bins, main
from kernels.entropy import bin_of
from runtime.decoding.heterospec import DEFAULT_BINS, load_bins


def test_fit_finds_the_steps_of_tcr():
    rng = np.random.default_rng(0)
    phi = rng.uniform(0, 8, 2000)
    tcr = np.floor(phi) * 2 + rng.normal(0, 0.1, phi.size)  # TCR steps up at every integer Φ
    b = fit_bins(phi, tcr, np.ones_like(phi))
    assert len(b["thresholds"]) == 7 and b["thresholds"] == sorted(b["thresholds"])
    np.testing.assert_allclose(b["thresholds"], np.arange(1, 8), atol=0.05)
    assert [bin_of(x, b["thresholds"]) for x in (0.5, 3.5, 7.5)] == [0, 3, 7]
    assert b["bin_mean_tcr"] == sorted(b["bin_mean_tcr"])


def test_refit_from_saved_paths(tmp_path, capsys):
    rng = np.random.default_rng(1)
    phi = rng.uniform(0, 8, 400)
    rows = {"phi": phi.tolist(), "tcr": (phi * 2).tolist(), "accepted": [1] * 400,
            "steps_accepted": [1] * 500, "target": "t", "prompts": 3}  # fmt: skip
    (tmp_path / "paths.json").write_text(json.dumps(rows))
    out = tmp_path / "bins.json"
    plot = tmp_path / "fidelity.svg"
    args = ["--out", str(out), "--from-paths", str(tmp_path / "paths.json"), "--plot", str(plot)]
    assert main(args + ["--min-leaf", "0.01"]) == 0
    assert len(load_bins(out)["thresholds"]) == 7
    svg = plot.read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == 12 + 8  # top-N ranks (12) + 8 bins
    assert main(["--out", str(out), "--from-paths", str(out)]) == 2  # a bins file, not paths
    assert "not a file from --save-paths" in capsys.readouterr().err


def test_shipped_bins_load():
    b = load_bins(DEFAULT_BINS)
    assert 1 <= len(b["thresholds"]) <= 7 and b["paths"] > 0
