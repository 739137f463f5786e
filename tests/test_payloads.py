"""Uplink payloads (k-sqs, c-sqs, cu-hlm): encode -> decode is the identity, the byte length
is the eq. (1)/(4) bit model plus the header and byte padding, and malformed payloads are
refused with MalformedPayload (a ValueError), never a crash."""

import math
import struct

import numpy as np
import pytest

from kernels import payload_sqs
from kernels.bitio import MalformedPayload
from kernels.payloads import decode, make_codec
from kernels.sampling import probs_from_logits, sample

PARAMS = {
    "k-sqs": dict(k=5, ell=30),
    "c-sqs": dict(ell=30, alpha=0.05, eta=0.05, beta=0.03),
    "cu-hlm": dict(k=6),
}


def draft_rows(v, n, seed, temp=1.0):
    rng = np.random.default_rng(seed)
    return probs_from_logits(rng.normal(0, 3, (n, v)), temp)


def round_trip(name, q, seed=0, **over):
    v = q.shape[1]
    codec = make_codec(name, **{**PARAMS[name], **over})
    rows = codec.quantize(q)
    q_hat = codec.qhat(rows, v)
    rng = np.random.default_rng(seed)
    tokens = np.array([int(sample(r, rng.random())) for r in q_hat])  # the draft samples from q^
    data = codec.encode(rows, tokens, v)
    assert len(data) == codec.header_bytes() + math.ceil(codec.body_bits(rows, v) / 8)
    got_tokens, got_q = decode(data, v, max_rows=max(1, len(tokens)))
    assert got_tokens.tolist() == tokens.tolist()
    np.testing.assert_array_equal(got_q, q_hat)  # bit-identical: the verifier sees the draft's q^
    return codec, rows, data


@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("temp", [0.2, 1.0, 3.0])
def test_round_trip_random(name, temp):
    round_trip(name, draft_rows(50, 20, seed=int(temp * 10), temp=temp))


@pytest.mark.parametrize("name", list(PARAMS))
def test_round_trip_large_vocabulary(name):
    round_trip(name, draft_rows(152_064, 3, seed=1))


def test_sqs_edge_cases():
    q = draft_rows(12, 6, seed=2)
    round_trip("k-sqs", q, k=1)  # K = 1: zero subset-of-lattice bits beyond the id
    round_trip("k-sqs", q, k=12)  # K = V: the subset costs 0 bits
    round_trip("k-sqs", q, k=7, ell=7)  # ell = K
    round_trip("k-sqs", q, k=3, ell=1)  # ell = 1: all mass on one token
    round_trip("c-sqs", q, beta=-1.0, eta=0.0)  # beta <= 0: the full vocabulary
    round_trip("c-sqs", q, beta=2.0, eta=0.0)  # beta > 1: the argmax alone
    round_trip("cu-hlm", q, k=1)
    round_trip("cu-hlm", q, k=11)  # k = V - 1
    codec, rows, data = round_trip("k-sqs", q[:0])  # an empty batch
    assert decode(data, 12)[0].size == 0


def test_ksqs_bits_match_eq1_per_row():
    from kernels.sqs import ksqs_bits

    codec, rows, data = round_trip("k-sqs", draft_rows(1000, 4, seed=3), k=8, ell=100)
    # + the token's id (10 bits) and its count (7 bits), sent in the clear since version 2
    assert codec.body_bits(rows, 1000) == 4 * (ksqs_bits(1000, 8, 100) + 10 + 7)


def test_csqs_and_cuhlm_bits_match_their_models():
    from kernels.sqs import csqs_bits

    v = 1000
    codec, rows, _ = round_trip("c-sqs", draft_rows(v, 6, seed=7), ell=100)
    ks = [len(r.ids) for r in rows]
    assert len(set(ks)) > 1  # the support really varies
    assert codec.body_bits(rows, v) == sum(csqs_bits(v, k, 100) + 10 + 7 for k in ks)
    codec, rows, _ = round_trip("cu-hlm", draft_rows(v, 3, seed=8), k=16)
    assert codec.body_bits(rows, v) == 3 * (10 + 16 * (8 + 10) + 10)  # k-1, eq. (4) for k, token


def test_encode_refuses_invalid_rows():
    q = draft_rows(20, 2, seed=4)
    codec = make_codec("k-sqs", k=4, ell=10)
    rows = codec.quantize(q)
    bad = [
        payload_sqs.SqsRow(rows[0].ids, rows[0].counts + 1),
        rows[1],
    ]  # counts not summing to ell
    with pytest.raises(ValueError, match="summing"):
        codec.encode(bad, [rows[0].ids[np.argmax(rows[0].counts)], rows[1].ids[0]], 20)
    outside = next(i for i in range(20) if i not in rows[0].ids)
    with pytest.raises(ValueError, match="no mass"):
        codec.encode(rows, [outside, rows[1].ids[np.argmax(rows[1].counts)]], 20)


def _ksqs_payload(v=20, k=4, ell=10):
    codec = make_codec("k-sqs", k=k, ell=ell)
    rows = codec.quantize(draft_rows(v, 1, seed=5))
    tok = rows[0].ids[np.argmax(rows[0].counts)]
    return codec.encode(rows, [tok], v)


def _rewrite_body(data, head, fields):
    """A K-SQS payload with the same header and a body of the given (value, bits) fields."""
    from kernels.bitio import BitWriter

    w = BitWriter()
    for val, nb in fields:
        w.write(val, nb)
    h = bytearray(data[:head])
    struct.pack_into(">I", h, 8, w.nbits)
    return bytes(h) + w.getvalue()


def test_decode_refuses_malformed_payloads():
    v, k, ell = 20, 4, 10
    data = _ksqs_payload(v, k, ell)
    head = payload_sqs.header_bytes(False)
    sb, lb, tb, cb = (
        math.ceil(math.log2(math.comb(v, k))),
        math.ceil(math.log2(math.comb(ell + k - 1, k - 1))),
        5,  # the token's id: ceil(log2 20)
        4,  # its count - 1: ceil(log2 10)
    )
    cases = {
        "empty": b"",
        "short header": data[:5],
        "unknown codec": b"\x09" + data[1:],
        "wrong V": data,  # decoded against V = 21 below
        "bit length lies (too long)": data[:8]
        + struct.pack(">I", 8 * (len(data) - head) + 1)
        + data[12:],
        "bit length lies (too short)": data[:8] + struct.pack(">I", 1) + data[12:],
        "truncated body": data[:-1],
        "extra byte": data + b"\0",
        "subset rank out of range": _rewrite_body(
            data, head, [(math.comb(v, k), sb), (0, lb), (0, tb), (0, cb)]
        ),
        "counts not summing to ell": _rewrite_body(
            data, head, [(0, sb), (math.comb(ell + k - 1, k - 1), lb), (0, tb), (0, cb)]
        ),
        "token out of range": _rewrite_body(data, head, [(0, sb), (0, lb), (20, tb), (0, cb)]),
        "count above ell": _rewrite_body(data, head, [(0, sb), (0, lb), (0, tb), (10, cb)]),
        "K above V": data[: head - 6] + struct.pack(">IH", v + 1, ell) + data[head:],
        "ell zero": data[: head - 2] + struct.pack(">H", 0) + data[head:],
    }
    for what, bad in cases.items():
        with pytest.raises(MalformedPayload):
            decode(bad, v + 1 if what == "wrong V" else v)
        assert isinstance(MalformedPayload(what), ValueError)


def test_decode_refuses_token_without_mass_and_huge_k():
    v, k, ell = 20, 4, 10
    data = _ksqs_payload(v, k, ell)
    head = payload_sqs.header_bytes(False)
    sb, lb = (
        math.ceil(math.log2(math.comb(v, k))),
        math.ceil(math.log2(math.comb(ell + k - 1, k - 1))),
    )
    # subset rank 0 is {0, 1, 2, 3}, lattice rank 0 is (0, 0, 0, ell) in colex order: token 0
    # has no mass, and token 3 has count ell, not 1; both pass every check but the unranked one
    no_mass = _rewrite_body(data, head, [(0, sb), (0, lb), (0, 5), (0, 4)])
    wrong_count = _rewrite_body(data, head, [(0, sb), (0, lb), (3, 5), (0, 4)])
    for bad, says in ((no_mass, "no mass"), (wrong_count, "not its lattice count")):
        with pytest.raises(MalformedPayload, match=says):
            decode(bad, v)
        tokens, coded = payload_sqs.decode_lazy(bad, v)
        with pytest.raises(MalformedPayload, match=says):
            coded.row(0)
    # C-SQS claiming K = V/2 of a 152k vocabulary in a 100-byte body: refused before any big
    # binomial
    big_v = 152_064
    body = b"\x7f" * 100
    fake = (
        struct.pack(">BBHII", payload_sqs.C_SQS, payload_sqs.VERSION, 1, big_v, 800)
        + struct.pack(">H", 100)
        + body
    )
    with pytest.raises(MalformedPayload, match="cannot fit"):
        decode(fake, big_v)


@pytest.mark.parametrize("name", ["k-sqs", "c-sqs"])
def test_lazy_decode_equals_the_eager_one(name):
    """decode_lazy's q^_i(d_i) are the dense rows' entries bit for bit, and row(i) unranks one
    row to what decode gives, counting the rows it unranked."""
    v = 300
    codec = make_codec(name, **({"k": 40, "ell": 200} if name == "k-sqs" else {"ell": 200}))
    rows = codec.quantize(draft_rows(v, 5, seed=11))
    rng = np.random.default_rng(0)
    q_hat = codec.qhat(rows, v)
    tokens = [int(rng.choice(v, p=r / r.sum())) for r in q_hat.astype(np.float64)]
    data = codec.encode(rows, tokens, v)
    toks, dense, _ = payload_sqs.decode(data, v)
    ltoks, coded = payload_sqs.decode_lazy(data, v)
    assert ltoks.tolist() == toks.tolist() == tokens and len(coded) == 5
    assert np.array_equal(coded.token_probs, dense[np.arange(5), toks])
    assert coded.unranked == 0
    assert np.array_equal(coded.row(3), dense[3]) and coded.unranked == 1
    assert np.array_equal(np.stack([coded.row(i) for i in range(5)]), dense)


def test_verify_sampling_expands_only_the_rejected_row():
    """kernels.verify.verify_sampling on coded rows: same verdict as on the dense q^, and the
    only row unranked is the first rejected one (none when all are accepted)."""
    from kernels.verify import verify_sampling

    v = 300
    codec = make_codec("k-sqs", k=40, ell=200)
    rows = codec.quantize(draft_rows(v, 6, seed=12))
    q_hat = codec.qhat(rows, v)
    rng = np.random.default_rng(1)
    tokens = [int(rng.choice(v, p=r / r.sum())) for r in q_hat.astype(np.float64)]
    data = codec.encode(rows, tokens, v)
    p = draft_rows(v, 7, seed=13)
    seen = set()
    for trial in range(40):
        u = rng.random(6) * (trial % 4 != 0)  # u = 0 accepts every row (p > 0 everywhere)
        u_last = rng.random()
        _, coded = payload_sqs.decode_lazy(data, v)
        a, c = verify_sampling(p, coded, np.array(tokens), u, u_last)
        assert (a, c) == verify_sampling(p, q_hat, np.array(tokens), u, u_last)
        assert coded.unranked == (0 if a == 6 else 1)
        seen.add(a == 6)
    assert seen == {True, False}  # both paths were taken


def test_decode_bounds_rows():
    q = draft_rows(12, 40, seed=9)
    codec = make_codec("k-sqs", k=1, ell=1)  # the cheapest rows: 4 bits each
    rows = codec.quantize(q)
    data = codec.encode(rows, [r.ids[0] for r in rows], 12)
    assert len(decode(data, 12, max_rows=40)[0]) == 40
    with pytest.raises(MalformedPayload, match="limit"):
        decode(data, 12, max_rows=39)


# (valid levels, bad cases) per scale: linear v / 255, log 2^(-16 v / 255) with 255 = no mass
MALFORMED_LEVELS = {
    "linear": ([100, 100], [[200, 100], [255, 0]]),  # past 1; token 4 at level 0
    "log": ([16, 16], [[0, 0], [0, 255]]),  # 1 + 1 past 1; token 4 at level 255 (no mass)
}


@pytest.mark.parametrize("levels", list(MALFORMED_LEVELS))
def test_cuhlm_decode_refuses_malformed(levels):
    v = 30
    codec = make_codec("cu-hlm", k=4, levels=levels)
    rows = codec.quantize(draft_rows(v, 1, seed=6))
    data = codec.encode(rows, [rows[0].ids[0]], v)
    assert data[1] == {"linear": 1, "log": 3}[levels]
    from kernels.bitio import BitWriter

    def body(k, ids, lv, tok):
        w = BitWriter()
        w.write(k - 1, 5)
        for i in ids:
            w.write(i, 5)
        for x in lv:
            w.write(x, 8)
        w.write(tok, 5)
        return data[:8] + struct.pack(">I", w.nbits) + data[12:13] + w.getvalue()

    ok, (past_one, no_mass) = MALFORMED_LEVELS[levels]
    assert decode(body(2, [3, 4], ok, 3), v)[0].tolist() == [3]
    for bad in [
        body(2, [3, 3], ok, 3),  # repeated id
        body(2, [3, 4], past_one, 3),  # levels past 1
        body(2, [3, 31], ok, 3),  # id out of range
        body(2, [3, 4], no_mass, 4),  # token with no mass
        body(30, list(range(30)), [1] * 30, 0),  # k = V: no residual
    ]:
        with pytest.raises(MalformedPayload):
            decode(bad, v)
    for version in (0, 5):  # unknown versions
        with pytest.raises(MalformedPayload, match="version"):
            decode(data[:1] + bytes([version]) + data[2:], v)


def test_cuhlm_log_sum_tolerance_is_named_and_tight():
    """The log levels' sum may pass 1 by float rounding only: LOG_SUM_TOL, far below one level."""
    from kernels import payload_cuhlm
    from kernels.bitio import BitWriter

    v = 30
    w = BitWriter()
    w.write(1, 5)  # k = 2
    w.write_array(np.array([3, 4]), 5)
    w.write_array(np.array([16, 15]), 8)  # 2^-1.004 + 2^-0.941 = 1.018: past 1 by far more
    w.write(3, 5)
    head = struct.pack(">BBHIIB", payload_cuhlm.CU_HLM, payload_cuhlm.VERSION_LOG, 1, v, w.nbits, 8)
    with pytest.raises(MalformedPayload, match="tolerance"):
        decode(head + w.getvalue(), v)
    assert payload_cuhlm.LOG_SUM_TOL < 1e-6


# Bytes of kernels/payload_cuhlm.py before log levels existed (main at be6e3b8), V = 13
OLD_V1 = "030100020000000d0000004008272b783c03200fe5"  # two rows, no skip
OLD_V2 = "030200030000000d00000047081395bc1e01bd001fc0"  # the same with a skipped row between


def test_cuhlm_versions_1_and_2_are_unchanged_byte_for_byte():
    from kernels import payload_cuhlm as P

    r0 = P.CuRow(np.array([7, 2, 11]), np.array([120, 60, 3], np.uint8))  # scale: linear
    r2 = P.CuRow(np.array([0]), np.array([254], np.uint8))
    assert P.encode([r0, r2], [2, 5], 13).hex() == OLD_V1
    assert P.encode([r0, None, r2], [7, 4, 0], 13).hex() == OLD_V2
    toks, q_hat, rows = P.decode(bytes.fromhex(OLD_V2), 13)
    assert toks.tolist() == [7, 4, 0] and rows[1] is None and rows[0].scale == "linear"
    np.testing.assert_array_equal(q_hat[0], P.qhat_rows([r0], 13)[0])


@pytest.mark.parametrize("levels", ["log", "linear"])
def test_cuhlm_round_trips_in_both_scales(levels):
    q = draft_rows(12, 6, seed=2)
    for k in (1, 5, 11):  # k = V - 1 included
        codec, rows, data = round_trip("cu-hlm", q, k=k, levels=levels)
        assert data[1] == {"log": 3, "linear": 1}[levels]
    round_trip("cu-hlm", draft_rows(4096, 4, seed=9, temp=1.0), k=256, levels=levels)
    with pytest.raises(ValueError, match="levels"):
        make_codec("cu-hlm", levels="cubic")


def test_cuhlm_log_rows_with_skips_are_version_4():
    from kernels import payload_cuhlm as P

    codec = make_codec("cu-hlm", k=3, levels="log")
    rows = codec.quantize(draft_rows(20, 2, seed=12))
    toks = [int(rows[0].ids[0]), 9, int(rows[1].ids[0])]
    data = P.encode([rows[0], None, rows[1]], toks, 20)
    assert data[1] == P.VERSION_LOG_SKIP
    got, q_hat, back = P.decode(data, 20)
    assert got.tolist() == toks and back[1] is None and back[0].scale == "log"
    np.testing.assert_array_equal(q_hat[[0, 2]], codec.qhat(rows, 20))
    lin = make_codec("cu-hlm", k=3, levels="linear").quantize(draft_rows(20, 1, seed=12))
    with pytest.raises(ValueError, match="one scale"):
        P.encode([rows[0], lin[0]], [toks[0], int(lin[0].ids[0])], 20)


@pytest.mark.parametrize("name", list(PARAMS))
def test_mutated_payloads_decode_or_refuse_cleanly(name):
    """Bounded fuzz: flipped bits, truncations and splices give MalformedPayload or a valid
    decode."""
    v = 40
    codec = make_codec(name, **PARAMS[name])
    rows = codec.quantize(draft_rows(v, 4, seed=10))
    rng = np.random.default_rng(11)
    toks = [int(sample(r, rng.random())) for r in codec.qhat(rows, v)]
    data = codec.encode(rows, toks, v)
    for _ in range(300):
        bad = bytearray(data)
        how = rng.integers(0, 3)
        if how == 0:
            i = int(rng.integers(0, len(bad)))
            bad[i] ^= 1 << int(rng.integers(0, 8))
        elif how == 1:
            bad = bad[: int(rng.integers(0, len(bad)))]
        else:
            bad += bytes(rng.integers(0, 256, int(rng.integers(1, 5))).astype(np.uint8))
        try:
            t, qh = decode(bytes(bad), v)
        except MalformedPayload:
            continue
        assert len(t) == len(qh) and all(qh[i, t[i]] > 0 for i in range(len(t)))
