"""runtime/caches/buffer.py: the preallocated cache the ONNX target writes in place behaves as
runtime/caches/concat.py's ConcatKVCache under every operation the decoding methods use (a random
program of puts, in-place appends, trims, forks, selects and column keeps, compared after each
step), and an ONNX target pass through it gives the logits and keys a concatenating cache gets."""

import numpy as np

from runtime.backends.onnx.target import OnnxTargetLM
from runtime.caches.buffer import STEP, BufferKVCache
from runtime.caches.concat import ConcatKVCache

KV, D, LAYERS = 2, 3, 3


def _same(buf: BufferKVCache, ref: ConcatKVCache):
    assert buf.offset == ref.offset and buf.batch == ref.batch
    for i in range(LAYERS):
        assert buf.layer_offset(i) == ref.layer_offset(i)
        for a, b in zip(buf.get(i), ref.get(i), strict=True):
            np.testing.assert_array_equal(a, b)


def test_random_programs_match_the_concatenating_cache():
    rng = np.random.default_rng(0)
    for _ in range(20):
        buf = BufferKVCache(LAYERS, 2, KV, D, max_context=4 * STEP)
        ref = ConcatKVCache(LAYERS, 2, lambda b: np.zeros((b, KV, 0, D), np.float32))
        for _ in range(30):
            op = rng.choice(["append", "put", "trim", "fork", "select", "keep"])
            if op in ("append", "put"):
                T = int(rng.integers(1, 200))
                for i in range(LAYERS):
                    k, v = rng.standard_normal((2, buf.batch, KV, T, D)).astype(np.float32)
                    if op == "append":  # as an in-place pass writes: into the buffer, then advance
                        off = buf.layer_offset(i)
                        buf.reserve(i, off + T)
                        bk, bv = buf.buffers(i)
                        bk[:, :, off : off + T], bv[:, :, off : off + T] = k, v
                        buf.advance(i, T)
                    else:
                        pk, pv = ref.get(i)
                        buf.put(i, np.concatenate([pk, k], 2), np.concatenate([pv, v], 2))
                    pk, pv = ref.get(i)
                    ref.put(i, np.concatenate([pk, k], 2), np.concatenate([pv, v], 2))
            elif op == "trim":
                n = int(rng.integers(0, 50))
                assert buf.trim(n) == ref.trim(n)
            elif op in ("fork", "select"):
                rows = list(rng.integers(0, buf.batch, int(rng.integers(1, 4))))
                if op == "fork":
                    forked, fref = buf.fork(rows), ref.fork(rows)
                    _same(forked, fref)
                else:
                    buf.select(rows)
                    ref.select(rows)
            else:
                n = buf.offset
                cols = sorted(rng.choice(n, int(rng.integers(0, n + 1)), replace=False).tolist())
                if rng.random() < 0.3:
                    cols = list(range(len(cols)))  # a prefix: an offset move
                buf.keep_columns(cols)
                ref.keep_columns(cols)
            _same(buf, ref)


def test_capacity_grows_in_steps_and_stops_at_the_context():
    buf = BufferKVCache(1, 1, KV, D, max_context=STEP + 10)
    buf.reserve(0, 5)
    assert buf.capacity(0) == STEP
    buf.reserve(0, STEP + 1)
    assert buf.capacity(0) == STEP + 10


def test_an_in_place_pass_equals_a_concatenating_one(tiny_dir):
    d = tiny_dir("llama", tie_word_embeddings=True)
    lm = OnnxTargetLM(d, "int4", intra_threads=1)
    c = lm.config

    def concat():
        return ConcatKVCache(
            c.num_layers, 1, lambda b: np.zeros((b, c.num_kv_heads, 0, c.head_dim), np.float32)
        )

    buf, cat = lm.new_cache(), concat()
    assert isinstance(buf, BufferKVCache)
    rng = np.random.default_rng(1)
    for T in (9, 1, 1, 4, 1):
        x = rng.integers(0, c.vocab_size, (1, T))
        np.testing.assert_array_equal(lm.forward(x, buf), lm.forward(x, cat))
        for i in range(c.num_layers):
            for a, b in zip(buf.get(i), cat.get(i), strict=True):
                np.testing.assert_array_equal(a, b)
        buf.trim(1), cat.trim(1)  # a rejection: the next pass overwrites the stale column


def test_the_layout_token_changes_exactly_when_a_buffer_is_replaced():
    """The ONNX target keeps an IOBinding of the buffers while the token stays: growing or
    selecting rows replaces buffers (a new token, unique in the process), writing in place and
    moving offsets do not."""
    c = BufferKVCache(2, 2, 1, 4, max_context=4096)
    t0 = c.layout
    c.reserve(0, 10)  # grows from nothing: new buffers
    t1 = c.layout
    assert t1 != t0
    c.reserve(0, 20), c.advance(0, 3), c.trim(1)  # fits: in place
    c.keep_columns([0, 1])
    assert c.layout == t1
    f = c.fork([1])
    c.select([0])
    assert len({t0, t1, f.layout, c.layout}) == 4
    assert BufferKVCache(2, 1, 1, 4).layout not in (t0, t1, f.layout, c.layout)
