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


def test_heterospec_shape_extends_and_sizes_n_prime(tiny_dir):
    """§4.3 on a real drafter: a low-entropy bin grows Δ = α - i levels and keeps N' = γ_i·N + Δ
    nodes, never fewer than the extended depth d' (γ_0·12 + 3 = 7 < d' = 9) nor more than the
    context's room; bin 2 (γ = 1) keeps N + Δ, one more than --top-n."""
    from runtime.backends import load_model
    from runtime.decoding.heterospec import make_shape
    from runtime.decoding.tree_draft import TreeDrafter

    model = load_model(tiny_dir("qwen3"), "mlx")

    def shaped(bin_index: int, cap: int = 100):
        drafter = TreeDrafter(model, model.new_cache(), [11, 42, 7, 99], 2, expand=1)
        drafter.grow(5)  # d_base = 6
        # Φ >= 0 always: -1 thresholds put it above the first `bin_index` splits only
        bins = {"thresholds": [-1.0] * bin_index + [1e9] * (7 - bin_index)}
        n, info = make_shape(bins, 2)(drafter, 12, 100, cap)
        return n, info["bin"], drafter.depth

    assert shaped(0) == (9, 0, 9)  # max(round(0.3·12) + 3, 9)
    assert shaped(1) == (9, 1, 8)  # round(0.6·12) + 2 = 9 >= d' = 8
    assert shaped(2) == (13, 2, 7)  # 12 + 1: above --top-n, as the paper's N' allows
    assert shaped(5) == (12, 5, 6)  # a high-entropy bin keeps the base tree
    assert shaped(0, cap=5)[0] == 5  # never more than the verification window has room for


def test_skip_per_category_holds_out_what_the_bench_measures():
    from apps.bench.prompt_set import load_prompts
    from apps.train.bins import after_each_category

    recs = load_prompts("chat")
    bench = load_prompts("chat", per_category=2)
    kept = after_each_category(recs, 2)
    ids = {r["question_id"] for r in kept}
    assert len(kept) == len(recs) - len(bench)
    assert not ids & {r["question_id"] for r in bench}
