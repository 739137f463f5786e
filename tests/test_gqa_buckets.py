"""runtime/backends/onnx/gqa_buckets.py: the cuts measured on this machine are the only places where
GroupQueryAttention's multi-query path sums a row differently. A row computed in a padded
one-token pass (2 rows) equals the same row inside any window that spans no cut, and a window
that does span one differs (where the machine has cuts at all); the probe's extrapolation
continues its spacing."""

import numpy as np
import pytest

from runtime.backends.onnx import gqa_buckets
from runtime.backends.onnx.gqa_buckets import _gqa_session, key_cuts


def _rows(heads, kv, d, n=400, seed=1):
    s = _gqa_session(heads, kv, d)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, n, heads * d)).astype(np.float32)
    k = rng.standard_normal((1, n, kv * d)).astype(np.float32)
    v = rng.standard_normal((1, n, kv * d)).astype(np.float32)
    K = np.ascontiguousarray(k.reshape(1, n, kv, d).transpose(0, 2, 1, 3))
    V = np.ascontiguousarray(v.reshape(1, n, kv, d).transpose(0, 2, 1, 3))

    def row(p, off, T):  # row p of a T-row pass starting at off
        tot = off + T
        feed = {"q": q[:, off:tot], "k": k[:, off:tot], "v": v[:, off:tot], "pk": K[:, :, :off],
                "pv": V[:, :, :off], "sl": np.array([tot - 1], np.int32),
                "tot": np.array(tot, np.int32),
                "bias": np.zeros((1, 1, T, tot), np.float32)}  # fmt: skip
        return s.run(["o"], feed)[0][0, p - off]

    return row


@pytest.mark.parametrize("shape", [(4, 1, 256), (9, 3, 64)])
def test_windows_that_span_no_cut_equal_padded_one_token_passes(shape):
    cuts = key_cuts(*shape, upto=400)
    row = _rows(*shape)
    rng = np.random.default_rng(0)
    checked = spanning = 0
    for _ in range(150):
        T = int(rng.integers(2, 9))
        off = int(rng.integers(1, 390 - T))
        p = off + int(rng.integers(0, T - 1))  # not the window's last row: its padded twin differs
        # the window has off + T keys, the padded pass p + 2: a cut c moves the sums between
        # c + 1 and c + 2 keys, so the two differ iff some cut lies in (p, off + T - 2]
        spans = any(p < c <= off + T - 2 for c in cuts)
        same = np.array_equal(row(p, off, T), row(p, p, 2))
        if not spans:
            assert same, (shape, off, T, p, cuts)
            checked += 1
        spanning += spans
    assert checked > 50


def test_the_probe_extends_its_last_spacing(monkeypatch):
    key_cuts.cache_clear()
    monkeypatch.setattr(gqa_buckets, "PROBE_POSITIONS", 200)
    got = key_cuts(4, 1, 256, upto=1000)
    key_cuts.cache_clear()
    if len(got) < 2:
        pytest.skip("this machine's GQA does not bucket 256-wide heads: nothing to extend")
    steps = np.diff(got)
    assert (steps == steps[-1]).all() and got[-1] + steps[-1] >= 1000


def test_the_probe_is_kept_for_the_next_process_and_a_bad_file_is_probed_over(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gqa_buckets, "PROBE_POSITIONS", 200)
    key_cuts.cache_clear()
    first = key_cuts(4, 1, 256, upto=1000)
    assert (tmp_path / "gqa_buckets.json").is_file()
    key_cuts.cache_clear()  # a new process: the file answers, nothing is probed

    def no_probe(*a):
        raise AssertionError("probed again")

    with monkeypatch.context() as m:
        m.setattr(gqa_buckets, "_probe", no_probe)
        assert key_cuts(4, 1, 256, upto=1000) == first
    (tmp_path / "gqa_buckets.json").write_text("{not json")
    key_cuts.cache_clear()
    assert key_cuts(4, 1, 256, upto=1000) == first  # probed again, and kept again
    key_cuts.cache_clear()
