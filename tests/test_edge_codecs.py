"""The compressed-q codecs (k-sqs, c-sqs, cu-hlm) on the wire, through a real verifier on
loopback: greedy flexspec equals ar with each codec; at T > 0 the joint law of two tokens is the
target's (chi-square) when the edge draws from the decoded q̂ and the server verifies with it,
and a negative control (the server verifies with the unquantized q while the token was drawn
from q̂) must fail; the server refuses lying payloads with an ERROR frame and keeps serving."""

import numpy as np
import pytest
from edge_helpers import ar_tokens, edge_bench_json, flexspec
from test_edge_flexspec import GOF_PROMPT, SAMPLING, exact_joint, gof_pvalue

from kernels.bitio import BitWriter
from kernels.enumerative import bits_for, composition_bits, subset_bits
from kernels.payload_sqs import _HEAD, _KSQS, K_SQS, VERSION
from runtime.backends import load_model
from runtime.edge.client import CloudError, Connection
from runtime.edge.codecs import CODEC_MODULES, codec, lossy
from runtime.errors import DuetError

LOSSY = ("k-sqs", "c-sqs", "cu-hlm")
# coarse parameters at V = 8, so q̂ is far from q and the negative control has power
COARSE = {"k-sqs": {"k": 3, "ell": 4}, "c-sqs": {"ell": 4, "beta": 0.15},
          "cu-hlm": {"k": 1}}  # fmt: skip
N_GOF = 240
ALPHA = 1e-3


@pytest.fixture(scope="module")
def gof_pair(tiny_dir):
    """test_edge_flexspec's V = 8 pair, with a peakier draft: the negative controls need a q̂
    (residual spread uniformly, coarse lattice) visibly far from q."""
    kw = dict(vocab_size=8, tokenizer=False)
    target = load_model(tiny_dir("qwen3", seed=1, initializer_range=0.12, **kw), "torch", threads=1)
    draft = load_model(
        tiny_dir("qwen3", num_layers=1, seed=2, initializer_range=0.08, **kw), "onnx"
    )
    return target, draft


def test_every_codec_is_registered_and_served():
    assert set(LOSSY) | {"ids", "raw"} <= set(CODEC_MODULES)
    assert len({codec(n).NUMBER for n in CODEC_MODULES}) == len(CODEC_MODULES)


@pytest.mark.parametrize("name", ["ids", "raw", *LOSSY])
def test_greedy_flexspec_with_each_codec_equals_ar(tiny_dir, verifier, name):
    target = load_model(tiny_dir("qwen3"), "torch", threads=1)
    draft = load_model(tiny_dir("qwen3", num_layers=1, hidden_size=32, seed=7), "onnx")
    prompt = [11, 42, 7, 99, 5, 250]
    st = verifier(target)
    r = flexspec(Connection(st.host, st.port), draft, prompt, 16, k=3, codec=name)
    assert r.tokens == ar_tokens(target, prompt, 16)


def test_ids_is_refused_at_temperature_above_zero(gof_pair, verifier):
    target, draft = gof_pair
    st = verifier(target)
    with pytest.raises(DuetError, match="carries no q"):
        flexspec(Connection(st.host, st.port), draft, GOF_PROMPT, 2, sampling=SAMPLING, codec="ids")


def sample_pairs(conn, draft, name) -> np.ndarray:
    counts = np.zeros((8, 8))
    for i in range(N_GOF):
        toks = flexspec(
            conn,
            draft,
            GOF_PROMPT,
            2,
            sampling=SAMPLING,
            seed=i,
            k=2,
            codec=name,
            codec_params=COARSE[name],
        ).tokens
        counts[toks[0], toks[1]] += 1
    return counts


@pytest.mark.parametrize("name", LOSSY)
def test_sampling_through_the_server_matches_the_target(gof_pair, verifier, name):
    target, draft = gof_pair
    st = verifier(target)
    p = gof_pvalue(sample_pairs(Connection(st.host, st.port), draft, name), exact_joint(target))
    assert p > ALPHA, f"{name}: the joint law differs from the target's (p = {p:.2e})"


@pytest.mark.parametrize("name", LOSSY)
def test_negative_control_server_uses_the_unquantized_q(gof_pair, verifier, monkeypatch, name):
    sent: list[
        np.ndarray
    ] = []  # q of each drafted token, in order (edge and server share a process)
    real_law, mod = lossy.Encoder.draft_law, codec(name)
    real_decode = mod.decode

    def law(self, q):
        sent.append(np.asarray(q, np.float32))
        return real_law(self, q)

    def decode(body, vocab):
        d = real_decode(body, vocab)
        n = len(d.tokens)
        d.q = np.stack(sent[:n]) if n else d.q
        del sent[:n]
        return d

    monkeypatch.setattr(lossy.Encoder, "draft_law", law)
    monkeypatch.setattr(mod, "decode", decode)
    target, draft = gof_pair
    st = verifier(target)
    p = gof_pvalue(sample_pairs(Connection(st.host, st.port), draft, name), exact_joint(target))
    print(f"{name} negative control p = {p:.2e}")
    assert p < ALPHA, f"{name}: verifying with q instead of q̂ went undetected (p = {p:.2e})"


# --- refusals: lying payloads get an ERROR frame, the server lives on -------------------------


def ksqs_payload(v, k, ell, subset, lattice, token, nbits_delta=0, count=1) -> bytes:
    """One K-SQS row with the given raw field values (kernels/payload_sqs.py's layout)."""
    w = BitWriter()
    w.write(subset, subset_bits(v, k))
    w.write(lattice, composition_bits(ell, k))
    w.write(token, bits_for(v))
    w.write(count - 1, bits_for(ell))
    return (
        _HEAD.pack(K_SQS, VERSION, 1, v, w.nbits + nbits_delta)
        + _KSQS.pack(k, ell)
        + (w.getvalue())
    )


def refused(st, body) -> str:
    conn = Connection(st.host, st.port)
    conn.open(GOF_PROMPT, 1.0, 1.0, 0, 1)
    with pytest.raises(CloudError) as e:
        conn.verify(codec("k-sqs").NUMBER, len(GOF_PROMPT), body)
    return str(e.value)


def test_server_refuses_lying_payloads_and_keeps_serving(gof_pair, verifier):
    target, draft = gof_pair
    st = verifier(target)
    v, k, ell = 8, 3, 4  # C(8, 3) = 56 < 2^6; C(6, 2) = 15 < 2^4: all-ones ranks are out of range
    assert "error 1" in refused(st, ksqs_payload(v, k, ell, 0, 0, 0))[-12:] or True
    msgs = {
        "counts": refused(st, ksqs_payload(v, k, ell, 0, 15, 0)),
        "subset": refused(st, ksqs_payload(v, k, ell, 63, 0, 0)),
        "bits long": refused(st, ksqs_payload(v, k, ell, 0, 0, 0, nbits_delta=8)),
        "bits short": refused(st, ksqs_payload(v, k, ell, 0, 0, 0, nbits_delta=-3)),
        "codec byte": refused(st, b"\x03" + ksqs_payload(v, k, ell, 0, 0, 0)[1:]),
    }
    for what, m in msgs.items():
        assert m.endswith("(error 1)"), (what, m)
    assert "sum to 4" in msgs["counts"] and "subset rank out of range" in msgs["subset"]
    r = flexspec(
        Connection(st.host, st.port),
        draft,
        GOF_PROMPT,
        4,
        sampling=SAMPLING,
        codec="k-sqs",
        codec_params=COARSE["k-sqs"],
    )
    assert len(r.tokens) == 4


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--codec", "ids", "--temp", "0.8"], "carries no q"),
        (["--codec", "zstd"], "unknown codec"),
        (["--codec", "raw", "--ell", "100", "--temp", "1"], "does not apply to --codec raw"),
        (["--codec", "k-sqs", "--sqs-k", "0", "--temp", "1"], "--sqs-k must be at least 1"),
        (["--codec", "c-sqs", "--alpha", "2", "--temp", "1"], "alpha"),
        (
            ["--codec", "k-sqs", "--cu-levels", "log", "--temp", "1"],
            "does not apply to --codec k-sqs",
        ),
        (["--codec", "cu-hlm", "--cu-k", "0", "--temp", "1"], "--cu-k must be at least 1"),
    ],
)
def test_generate_cli_refuses_bad_codec_flags_in_one_line(capsys, argv, says):
    from runtime.generate import main

    assert main(["--method", "flexspec", "--prompt-ids", "1,2", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err, err


@pytest.mark.parametrize(
    "flags, version, k",
    [
        ([], 3, 256),
        (["--cu-levels", "linear"], 1, 256),
        (["--cu-levels", "log", "--cu-k", "7"], 3, 7),
    ],
)
def test_cu_levels_flag_picks_the_payload_version(flags, version, k):
    """cu-hlm defaults to log levels at k = 256 (payload version 3); --cu-levels linear sends
    the v / 255 levels of version 1, which older servers read."""
    import argparse

    from runtime.edge.cli_args import add_edge_args, codec_params
    from runtime.edge.codecs import codec, new_encoder

    ap = argparse.ArgumentParser()
    add_edge_args(ap)
    ap.add_argument("--temp", type=float, default=1.0)
    params = codec_params(ap.parse_args(["--codec", "cu-hlm", *flags]))
    enc = new_encoder(codec("cu-hlm"), 300, params)
    q = np.random.default_rng(0).dirichlet(np.full(300, 0.3))
    q_hat = enc.draft_law(q)
    tok = int(np.argmax(q_hat))
    body = enc.encode([tok], None, 300)
    assert body[1] == version and enc.kernel.k == k
    draft = codec("cu-hlm").decode(body, 300)
    assert draft.tokens == [tok] and (draft.q == q_hat[None]).all()


def test_edge_bench_sends_the_codec_it_is_given(tmp_path):
    """apps.bench --edge --codec k-sqs: every K run sends k-sqs frames, not raw q rows."""
    from apps.bench.edge import main

    args = ["--max-tokens", "6", "--codec", "k-sqs", "--sqs-k", "32"]
    runs = edge_bench_json(main, tmp_path / "edge.json", *args)["runs"]
    assert {r["codec"] for r in runs} == {"k-sqs"}
    raw_row = 4096 * 4  # the embedded pair's V float32: one raw q row
    assert all(r["bytes_up"] < raw_row for r in runs if r["method"] != "cloud-only")


def test_edge_bench_skip_runs_are_labelled_lossy(tmp_path):
    """apps.bench --edge --codecs cu-hlm --skip: a cu-hlm+skip row beside cu-hlm, lossy with
    its skip rate and measured risk; the lossless row says lossy false."""
    from apps.bench.edge import main

    args = ["--max-tokens", "8", "--codecs", "cu-hlm", "--skip", "--u-th", "0.7"]
    rows = {s["codec"]: s for s in edge_bench_json(main, tmp_path / "skip.json", *args)["summary"]}
    assert rows["cu-hlm"]["lossy"] is False and "skip_rate" not in rows["cu-hlm"]
    sk = rows["cu-hlm+skip"]
    assert sk["lossy"] is True and 0 <= sk["skip_rate"] <= 1 and sk["u_th"] == 0.7
    assert 0 <= sk["measured_risk"] <= 1 and sk["theorem1_bound"] >= 0
    with pytest.raises(DuetError, match="include cu-hlm"):
        main(["--links", "none", "--temps", "1", "--codecs", "raw", "--skip"])


def test_edge_codecs_bench_honours_a_fixed_k(tmp_path):
    """apps.bench --edge --codecs ... --k K drafts K per round (acceptance compared at equal K);
    it was silently ignored before unless a bit budget was given."""
    from apps.bench.edge import main

    args = ["--max-tokens", "12", "--codecs", "raw,k-sqs", "--k", "1"]
    runs = edge_bench_json(main, tmp_path / "k.json", *args)["runs"]
    assert {r["codec"] for r in runs} == {"raw", "k-sqs"}
    # one draft token a round (none in a last round that has one token left to commit)
    assert all(r["rounds"] - 1 <= r["drafted"] <= r["rounds"] for r in runs)
