"""The target on ONNX Runtime: exported graph parts, int4/int8 weights, KV cache as explicit I/O.

`OnnxTargetLM` is the CausalLM protocol over the parts that converters/onnx_target_export.py
writes (`full`: ids -> logits + hidden; `layers.a.b`; `head`). Each part is exported once, on
the first call that needs it, and cached beside the checkpoint in `<dir>/.duet/` under a name
keyed by the quantization, its recipe's hash and the layer range
(`target-int4-1a2b3c4d-full.onnx`); a later run opens
the cached file. Positions and a boolean mask (B, T, past + T) are what every pass takes, so
causal windows, tree masks and branch rows all run (under the recipe's attention "rows" every
pass goes to the graph as rows, one a token: runtime/backends/onnx/target_rows.py, so that at
int8 activations it equals one-token passes bit for bit); rollback moves the host cache's offset,
as on the other backends. Under "window" that cache is preallocated buffers
(runtime/caches/buffer.py) bound as both each layer's past and its present, so the attention
kernel appends a pass's keys in place and no step copies the past (runtime/caches/concat.py's
concatenating cache under "rows"; Gemma 3's sliding cache for its local layers). Layer ranges
(Mirror-SD's early exit) run the `layers.0.E` part, `head` on its hidden state, then
`layers.E.N` and `head`: hidden states stay NumPy between parts. Gemma 3's local layers hold
only their window and a slack (runtime/caches/sliding.py): their attention reads a local mask,
which the host builds from the mask and the held columns' positions, and the host keeps those
positions for the cache.

Threads: `intra_threads` ONNX Runtime intra-op threads for every part (runtime/load.py gives
the target all the cores a draft leaves, both of two for the draft-free methods).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from runtime.backends.onnx.residual import (
    Residual,
    _carried,
    _pad_one,
    forward_recording,
    head_span,
    one_row_apart,
)
from runtime.backends.onnx.target_rows import chunk_rows, row_feed
from runtime.caches.buffer import BufferKVCache
from runtime.caches.concat import ConcatKVCache
from runtime.caches.sliding import SlidingKVCache
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens, default_positions
from runtime.paths import is_stale, sidecar

QUANTIZE = ("int4", "int8", "none")
BLOCK_SIZE = 32
# How attention runs, and with it MatMulNBits' compute type (accuracy level) on the layers:
# "window": GroupQueryAttention over the whole pass, the layers at 4 (int8 activations, the
#   VNNI/dot-product kernels; level 1 computes in float32 and costs a 5-token pass 2.2x a
#   one-token one on SmolLM2-135M, against 1.5x at 4). At 4 every matmul and norm gives a
#   token's row bit for bit the same in any pass, and GQA's multi-query path does too for any
#   T >= 2 (a prefill of P or P + 3 tokens, a 5-token window or 2-token passes over the same past:
#   SmolLM2 int4, equal to the bit); only its one-query path (T = 1) sums in another order,
#   0.6 logits away after 30 layers once int8 rounding amplifies it, and greedy sd then left
#   ar. PAD_ONE_TOKEN: a one-token pass runs as two (_pad_one), so that path is never taken,
#   and sd, tree and mirror equal ar token for token. The second row costs a little (a 2-row
#   int8 matmul is ~1.3x a 1-row one; the head runs on the first row only, but for ONE_ROW).
# "rows": every token its own row (converters/onnx_target_rows.py), the layers at 4: the
#   one-query path for every token, through a gather of the keys each row sees (quadratic in
#   a prefill's length: a 200-token prefill 2.2 s against 1.1 s). Kept as a check on "window".
# The int4 agreement with float32 at 4 (`converters.onnx_target_cli agree`, held-out chat
# text, the Q4 grid's block sums fused: converters/onnx_grid_q4.py): SmolLM2-135M 0.971,
# Gemma 3 270M 0.969, against 0.973 and 0.971 at 1; llama.cpp's CPU kernels round activations
# to 8 bits too.
# The LM head runs at 4 under both: its 4-bit halves (converters/onnx_head_split.py) sum
# pairs to at most 2 * 15 * 128, which no kernel (AVX2 without VNNI sums pairs in a saturating
# int16, VPMADDUBSW) can clip.
# ONE_ROW: on x86-64 without VNNI, MatMulNBits at 4 sums a one-row product in a kernel of its own
#   (ORT's AVX2 M = 1 GEMV), ~1e-6 from the same row in any product of M >= 2 rows (which all
#   agree, at any position and thread count); int8 rounding grew that to unequal logits. There
#   the head runs on two rows where it would run on one (residual.head_span: the row before, or
#   a padded pass's second; a lone Residual's row twice) and "rows" pads one-token passes too.
#   Measured (1 intra-op thread, a 200-token past, CPU ms, a loaded 2-core EPYC): a one-token
#   pass SmolLM2-135M 30.8 -> 32.9 (+7 %), Gemma 3 270M (a 262k-row head) 60.4 -> 70.5
#   (+17 %); a window's head already ran on its rows, so 2- to 9-token passes are unchanged.
#   VNNI CPUs (the earlier CI's, equal without it) and arm64 keep their path.
# KEY_BUCKETS: GQA's multi-query path gives a row the same sums in any pass only while the
#   pass's key count stays in the row's bucket. With Gemma 3's 256-wide heads a row's output
#   changes (~3e-7, which int8 rounding grew to 3-5 logits and a two-turn chat prompt's sd
#   unequal to ar) when a pass's total keys cross 64, 192, 320, ... (64 + 128 k) on this
#   machine: on GQA alone, 15 of 15 failures across 1,300 (position, window) pairs sat on those
#   boundaries, and 0 of 5,447 pairs within a bucket differed; 64- and 128-wide heads showed
#   none. The boundaries are measured per head shape on the machine that runs the target
#   (runtime/backends/onnx/gqa_buckets.py; it finds exactly these here), and a pass is cut before
#   each position they name: at most one more run per 128 tokens.
ATTENTION = "window"
LEVELS = {"window": 4, "rows": 4}
HEAD_ACCURACY_LEVEL = 4


def int8_dot() -> bool:
    """Whether this CPU sums int8 products without an int16 step (x86 AVX-512 VNNI or AVX-VNNI,
    runtime/backends/onnx/cpu_int8.py): there one 8-bit MatMulNBits runs 8-bit weights
    (converters/onnx_head_split.py), at about 0.7x the time of two 4-bit ones; elsewhere the
    two halves, which no kernel can clip (arm64 too: its 8-bit kernels are unmeasured here)."""
    from runtime.backends.onnx.cpu_int8 import int8_path

    p = int8_path()
    return p.arch == "x86-64" and p.vnni


def recipe(quantize: str) -> dict:
    """What `quantize` means, as stored in the graph's metadata."""
    if quantize not in QUANTIZE:
        raise DuetError(f"unknown --quantize {quantize!r}; choose from {', '.join(QUANTIZE)}")
    # the number after "rows" moves when the rows graph does; a changed recipe re-exports
    rows = {"attention": "rows-2"} if ATTENTION == "rows" else {"present": "in-place"}
    rows["head_rows"] = True  # the head runs on the rows asked for (a prefill: its last)
    rows["parts"] = "residual carried apart"  # Residual: parts add it as the whole graph does
    if quantize == "none":
        return {"scheme": "none", **rows}
    bits = 4 if quantize == "int4" else 8
    return {"scheme": quantize, "op": "MatMulNBits", "bits": bits, "block_size": BLOCK_SIZE,
            "symmetric": True, "accuracy_level": LEVELS[ATTENTION], "head_bits": 8,
            "head_accuracy_level": HEAD_ACCURACY_LEVEL,
            "int8_as": "one 8-bit MatMulNBits (a VNNI CPU)" if int8_dot() else
            "two 4-bit MatMulNBits (hi/lo nibbles of symmetric int8 blocks)",
            "grid": bits == 4,  # weights on a GGUF Q4_0/Q4_1/Q4_K block grid kept exactly
            # their block sums as more columns of the same MatMulNBits (int8-rounded at level 4)
            "grid_sums": "fused columns" if bits == 4 else None,
            "source": "weights on a 4-bit block grid (a GGUF's Q4_0/Q4_1/Q4_K) kept exactly "
            "(converters/onnx_grid_q4.py); others requantized from the float32 weights",
            # a GGUF stored them at 5, 6 or 8 bits (Q5_0, Q6_K, Q8_0: most of a Q4_K_M file);
            # 4 bits would lose what llama.cpp keeps (Gemma 3 270M: 71 % top-1 agreement)
            "gguf_finer": "8 bits" if bits == 4 else None,
            "embedding": "float32", **rows}  # fmt: skip


def _first(outs: list[str]) -> int:
    """How many of a part's outputs come before its presents: (logits, hidden[, taps]) or
    (hidden, resid) (a Residual)."""
    return next((j for j, o in enumerate(outs) if o.startswith("present.")), len(outs))


def _kept(res: list, head: bool, keep: int, cut: slice) -> list:
    """A pass's outputs without a padded one-token pass's second row, the logits cut to the rows
    asked for (`cut` of the head's rows, which ONE_ROW may have widened)."""
    return [a[:, cut] if head and j == 0 else a[:, :keep] for j, a in enumerate(res)]


def part_name(start: int, stop: int, num_layers: int, head: bool, taps: tuple = ()) -> str:
    if head and start == 0 and stop == num_layers:
        return ".".join(["full", *(["taps", *map(str, taps)] if taps else [])])
    if start == stop and head:
        return "head"
    return f"layers.{start}.{stop}"


def recipe_tag(quantize: str) -> str:
    """A hash of the recipe: in the cached parts' names, and in the load spec, so that auto's
    stored measurements of an older recipe (devices/probe_store.py) are not read as this one's."""
    import hashlib

    return hashlib.sha1(json.dumps(recipe(quantize), sort_keys=True).encode()).hexdigest()[:8]


def part_path(d: Path, quantize: str, name: str) -> Path:
    """Where a part is cached: keyed by the quantization and a hash of its recipe, so a changed
    recipe (block size, accuracy level) exports afresh instead of reusing a stale file."""
    return sidecar(d, f"target-{quantize}-{recipe_tag(quantize)}-{name}.onnx")


def ensure_part(d: Path, quantize: str, start: int, stop: int, head: bool, n: int,
                taps: tuple = ()) -> Path:  # fmt: skip
    """The cached graph of one part, exported on first use (made once, redone when older than
    the checkpoint's weights)."""
    from runtime.backends.exporters import export  # converters/ registers the exporter

    out = part_path(d, quantize, part_name(start, stop, n, head, taps))
    if is_stale(out, Path(d).glob("*.safetensors")):
        try:
            export("onnx-target", d, out, start, stop, head, quantize, tuple(taps), source=d)
        except OSError as e:
            raise DuetError(
                f"{d}: cannot write the on-the-fly ONNX target export ({e}); build it with "
                f"`python -m converters export --role target --model {d} --format onnx "
                f"--quantize {quantize} --out DIR`"
            ) from None
    return out


class OnnxTargetLM:
    """CausalLM over the exported target parts of one checkpoint directory."""

    backend = "onnx"
    supports_layer_range = True
    logits_last = True  # forward(..., last=n): the head on the last n positions only

    def __init__(self, ckpt_dir, quantize: str = "int4", intra_threads: int = 2,
                 provider: str = "cpu"):  # fmt: skip
        if quantize not in QUANTIZE:
            raise DuetError(f"unknown --quantize {quantize!r}; choose from {', '.join(QUANTIZE)}")
        self.dir = Path(ckpt_dir)
        self.config = ModelConfig.from_dir(self.dir)
        if self.config.is_hybrid:
            raise DuetError(
                f"{self.dir}: the ONNX target runs Llama, Qwen2, Qwen3 and Gemma 3 checkpoints "
                f"(got {self.config.model_type}); use --target-backend torch"
            )
        self.sliding = tuple(getattr(self.config, "sliding", None) or ())  # Gemma 3's local layers
        self.quantize, self.provider, self.threads = quantize, provider, intra_threads
        # what identifies it (auto's stored measurements, devices/probe_store.py; a tuned exit
        # head beside the checkpoint), as load_model's models keep theirs
        self.load_spec = (str(self.dir), "onnx-target",
                          {"quantize": quantize, "intra_threads": intra_threads,
                           "recipe": recipe_tag(quantize)})  # fmt: skip
        self._sessions: dict[tuple, object] = {}
        self._bindings: dict[tuple, tuple] = {}  # kept KV bindings (_kv_binding)
        self.session = self._part(0, self.config.num_layers, True)  # exported/opened at load

    def _part(self, start: int, stop: int, head: bool, taps: tuple = ()):
        key = (start, stop, head, tuple(taps))
        if key not in self._sessions:
            from runtime.backends.onnx.llama import open_session

            n = self.config.num_layers
            p = ensure_part(self.dir, self.quantize, start, stop, head, n, tuple(taps))
            # the parts (layer ranges, the head) run in turn: their pools spinning against each
            # other made a 5-token pass through four parts 72 ms against the whole graph's 15;
            # sleeping between runs, 22 ms (SmolLM2-135M int4). The whole graph (taps or not)
            # keeps spinning
            s = open_session(p, self.provider, self.threads, 1,
                             spin=(start, stop, head) == (0, n, True))  # fmt: skip
            self._sessions[key] = (s, [o.name for o in s.get_outputs()],
                                   {i.name for i in s.get_inputs()})  # fmt: skip
        return self._sessions[key]

    @property
    def quantization(self) -> dict:
        """The recipe the full graph was built with (its `duet.quantization` metadata)."""
        s = self._part(0, self.config.num_layers, True)[0]
        return json.loads(s.get_modelmeta().custom_metadata_map.get("duet.quantization", "{}"))

    def new_cache(self, batch: int = 1):
        c = self.config
        empty = lambda b: np.zeros((b, c.num_kv_heads, 0, c.head_dim), np.float32)  # noqa: E731
        if ATTENTION == "window":  # written in place by the kernel (runtime/caches/buffer.py)
            # Gemma 3's local layers too: every column kept (columns are positions), their
            # window a mask over them. A local layer that held only its window would start its
            # keys at a column that depends on when it last evicted, which differs between ar
            # and sd; at int8 activations where a key sits in GQA's sums changes the logits
            return BufferKVCache(c.num_layers, batch, c.num_kv_heads, c.head_dim, c.max_context)
        if any(self.sliding):  # Gemma 3: local layers keep their window (runtime/caches/sliding.py)
            return SlidingKVCache(self.sliding, c.sliding_window, batch, empty,
                                  lambda b: np.zeros((b, 0), np.int64))  # fmt: skip
        return ConcatKVCache(c.num_layers, batch, empty)

    def _key_cuts(self) -> tuple[int, ...]:
        """Positions a pass is cut before (KEY_BUCKETS), measured once per head shape."""
        from runtime.backends.onnx.gqa_buckets import key_cuts

        c = self.config
        return key_cuts(c.num_heads, c.num_kv_heads, c.head_dim, c.max_context + 2)

    def _local_mask(self, cache, start: int, stop: int, pos, m):
        """The local layers' mask over their held columns (B, T, held + T) and those columns'
        positions (B, held + T): the last held + T columns of `m`, keys within the window."""
        local = [i for i in range(start, stop) if self.sliding[i]]
        if not local:
            return None, None
        held = [cache.get(i)[2] for i in local]
        if any(h.shape != held[0].shape or (h != held[0]).any() for h in held[1:]):
            raise DuetError("sliding-window cache: local layers out of step in one forward")
        key_pos = np.concatenate([np.broadcast_to(held[0], (pos.shape[0], held[0].shape[1])),
                                  pos], axis=1)  # fmt: skip
        S = key_pos.shape[1]
        near = key_pos[:, None, :] > pos[:, :, None] - self.config.sliding_window
        return np.ascontiguousarray(m[..., -S:] & near), key_pos

    def _run(self, x, cache, start: int, stop: int, head: bool, positions, mask, last=None,
             taps: tuple = ()):  # fmt: skip
        """[logits (B, min(last, T), V) when `head`,] hidden (B, T, C); `last` cuts the head to
        the pass's last rows (a prefill's 1). `taps` (the whole graph): a third array, those
        layers' outputs (B, T, len(taps) * C), from the graph that also returns them."""
        B, T = x.shape[:2]
        off = cache.layer_offset(start)
        pos = default_positions(off, B, T) if positions is None else np.asarray(positions)
        pos = np.ascontiguousarray(np.broadcast_to(pos, (B, T)), dtype=np.int64)
        m = causal_mask(off, T) if mask is None else np.asarray(mask, dtype=bool)
        m = np.ascontiguousarray(np.broadcast_to(m, (B, T, off + T)))
        session, outs, names = self._part(start, stop, head, taps)
        rows = "kv_index" in names or "local_kv_index" in names  # recipe attention "rows"
        if not rows and T > 1 and (m[:, :, off:] != np.tri(T, dtype=bool)).any():
            return self._tree_as_chains(x, cache, start, stop, head, pos, m, off, last, taps)
        if rows:  # a long pass: chunk by chunk, each over the keys the ones before it put
            n = chunk_rows(off, T)
            bounds = list(range(0, T, n))
        else:  # KEY_BUCKETS: cut before each position where GQA's sums change
            bounds = [0] + [c - off for c in self._key_cuts() if off < c < off + T]
        if len(bounds) > 1:
            want = T if last is None or not head else min(last, T)  # logits of the last `want`
            got = []
            for a, b in zip(bounds, [*bounds[1:], T], strict=True):
                got.append(self._run(x[:, a:b], cache, start, stop, head, pos[:, a:b],
                                     m[:, a:b, : off + b], max(0, min(b - a, b - (T - want))),
                                     taps))  # fmt: skip
            return [np.concatenate(parts, axis=1) for parts in zip(*got, strict=True)]
        keep = T
        # GQA's one-query path never taken (PAD_ONE_TOKEN); under "rows", MatMulNBits' one-row
        # kernel where it sums apart (ONE_ROW)
        if T == 1 and (not rows or one_row_apart()):
            x, pos, m = _pad_one(x, pos, m)
            T = 2
        lo, hi = (keep - min(last, keep), keep) if head and last is not None else (0, keep)
        a, b = head_span(lo, hi, T)  # ONE_ROW: a one-row head on two rows, `cut` kept
        lo, hi, cut = a, b, slice(lo - a, hi - a)
        if isinstance(cache, BufferKVCache) and not rows:
            return self._run_in_place(session, outs, names, x, pos, m, cache, start, stop, head,
                                      off, (lo, hi), keep, cut, taps)  # fmt: skip
        past = [cache.get(i)[:2] for i in range(start, stop)]
        lm, key_pos = self._local_mask(cache, start, stop, pos, m) if self.sliding else (None,) * 2
        if rows:
            feed = {**_carried(start, x), "position_ids": pos}
            if "head_rows" in names:
                feed["head_rows"] = np.array([lo, hi], np.int64)
            for tag, mm in (("", m if "kv_index" in names else None), ("local_", lm)):
                if mm is not None:
                    idx, seqlens, gm = row_feed(mm, self.config.num_kv_heads)
                    feed.update({f"{tag}kv_index": idx, f"{tag}seqlens_k": seqlens,
                                 f"{tag}gqa_mask": gm})  # fmt: skip
            for i, (k, v) in zip(range(start, stop), past, strict=True):
                feed[f"past.{i}.key"] = np.ascontiguousarray(k)
                feed[f"past.{i}.value"] = np.ascontiguousarray(v)
            res = session.run(outs, feed)
        else:
            res = self._run_window(session, outs, names, x, pos, m, lm, past, start, stop, off,
                                   (lo, hi))  # fmt: skip
        first = _first(outs)
        drop = T - keep  # a padded pass's second column is dropped
        for j, i in enumerate(range(start, stop)):
            k, v = res[first + 2 * j], res[first + 2 * j + 1]
            kv = (k[:, :, : k.shape[2] - drop], v[:, :, : v.shape[2] - drop])
            if self.sliding and self.sliding[i]:
                cache.put(i, *kv, key_pos[:, : key_pos.shape[1] - drop])
            else:
                cache.put(i, *kv)
        return _kept(res[:first], head, keep, cut)

    def _tree_as_chains(self, x, cache, start, stop, head, pos, m, off, last, taps=()):
        """A pass whose mask has holes in its window (a draft tree's nodes see their ancestors,
        not their siblings), run as one causal pass per root-to-leaf path (TREE_AS_CHAINS).

        In one window a node's keys would sit behind its siblings' masked columns, and the
        int8-activation layers turn the other order of GQA's sums into other logits; along its
        own path a node sees [past][ancestors][itself] as the one-token passes of ar do, so
        its logits and keys are ar's to the bit. Each path is rolled back before the next;
        the cache then holds every node's keys in window order, as one pass would leave it."""
        B, T = x.shape[:2]
        n = self.config.num_layers
        if B != 1 or (start, stop) != (0, n) or not head or not m[:, :, :off].all():
            raise DuetError("ONNX target: a masked window (tree) runs on one row over a whole "
                            "past, through every layer")  # fmt: skip
        win = m[0, :, off:]
        h = 0  # rows every later row sees (the committed tokens before a tree): one pass
        while h < T and win[h:, : h + 1].all() and not win[h, h + 1 :].any():
            h += 1
        if h:
            got0 = self._run(x[:, :h], cache, 0, n, True, pos[:, :h], m[:, :h, : off + h],
                             None, taps)  # fmt: skip
            got1 = self._tree_as_chains(x[:, h:], cache, 0, n, True, pos[:, h:], m[:, h:],
                                        off + h, None, taps)  # fmt: skip
            lg, *rest = (np.concatenate(p, axis=1) for p in zip(got0, got1, strict=True))
            return [lg[:, -last:] if last else lg, *rest]
        parent = [int(a[-1]) if len(a := np.flatnonzero(win[t, :t])) else -1 for t in range(T)]
        for t in range(T):  # a forest: each row sees exactly its ancestors and itself
            seen, a = {t}, parent[t]
            while a >= 0:
                seen.add(a)
                a = parent[a]
            if set(np.flatnonzero(win[t]).tolist()) != seen:
                raise DuetError("ONNX target: a mask row must see its ancestors' columns only")
        leaves = [t for t in range(T) if t not in set(parent)]
        rows_of, keys = [None] * T, [None] * T  # per node: its row of each output
        for leaf in leaves:
            path, t = [], leaf
            while t >= 0:
                path.append(t)
                t = parent[t]
            path.reverse()
            cache.trim(cache.offset - off)
            got = self._run(x[:, path], cache, 0, n, True, pos[:, path], None, None, taps)
            L = len(path)
            for j, t in enumerate(path):
                if keys[t] is None:
                    rows_of[t] = [a[:, j] for a in got]
                    keys[t] = [tuple(a[..., j - L, :].copy() for a in cache.get(i)[:2])
                               for i in range(n)]  # fmt: skip
        cache.trim(cache.offset - off)
        for i in range(n):  # every node's keys after the past, in window order
            got = cache.get(i)
            k, v = (np.concatenate([got[a], *[keys[t][i][a][:, :, None] for t in range(T)]],
                                   axis=2) for a in (0, 1))  # fmt: skip
            if isinstance(cache, SlidingKVCache) and self.sliding[i]:
                cache.put(i, k, v, np.concatenate([np.asarray(got[2]), pos], axis=1))
            else:
                cache.put(i, k, v)
        lg, *rest = (np.stack(p, axis=1) for p in zip(*rows_of, strict=True))
        return [lg[:, -last:] if last else lg, *rest]

    def _run_in_place(self, session, outs, names, x, pos, m, cache, start, stop, head, off,
                      rows_, keep, cut, taps=()):  # fmt: skip
        """One graph run of the whole pass with each layer's buffer bound as both its past and
        its present: the kernel appends the pass's keys and values at `off` in place
        (runtime/caches/buffer.py); logits and hidden are written into arrays made here. The
        offsets advance by `keep` (a padded one-token pass's second column is left stale)."""
        B, T = x.shape[:2]
        for i in range(start, stop):
            cache.reserve(i, off + T)
        lm = None  # Gemma 3's local layers: the mask within their window, columns as positions
        if any(self.sliding[start:stop]):
            near = np.arange(off + T)[None, None, :] > pos[:, :, None] - self.config.sliding_window
            lm = m & near
        first = _first(outs)
        C = self.config.hidden_size
        widths = {"logits": self.config.vocab_size, "hidden": C, "resid": C,
                  "taps": C * len(taps)}  # fmt: skip
        got = [np.empty((B, rows_[1] - rows_[0] if n == "logits" else T, widths[n]), np.float32)
               for n in outs[:first]]  # fmt: skip
        # the CPU kernel runs a multi-token window over a past one batch row at a time
        rows = [slice(r, r + 1) for r in range(B)] if B > 1 and T > 1 and off else [slice(None)]
        for r in rows:
            io = self._kv_binding(session, cache, start, stop, r)
            for name, arr in _carried(start, x[r]).items():
                io.bind_cpu_input(name, np.ascontiguousarray(arr))
            io.bind_cpu_input("position_ids", np.ascontiguousarray(pos[r]))
            if "attention_mask" in names:  # a part of local layers only takes local_mask
                io.bind_cpu_input("attention_mask", np.ascontiguousarray(m[r]))
            if lm is not None and "local_mask" in names:
                io.bind_cpu_input("local_mask", np.ascontiguousarray(lm[r]))
            if head:
                io.bind_cpu_input("head_rows", np.array(rows_, np.int64))
            for name, arr in zip(outs[:first], got, strict=True):
                a = arr[r]
                io.bind_output(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
            session.run_with_iobinding(io)
        for i in range(start, stop):
            cache.advance(i, keep)
        return _kept(got, head, keep, cut)

    def _kv_binding(self, session, cache, start: int, stop: int, r: slice):
        """An IOBinding with layers [start, stop)'s buffers (row r) bound as their past and
        present, kept while those buffers stay where they are: binding 60 of them anew cost
        ~1 ms a step on SmolLM2 (a 15 ms step). The cache's layout token (unique in the
        process, new whenever a buffer is replaced) says they have not moved, without reading
        60 views' addresses a step. The caller rebinds the pass's own inputs."""
        key = (id(session), start, stop, r.start)
        kept = self._bindings.get(key)
        if kept is not None and kept[0] == (cache.layout, r.stop):
            return kept[1]
        bufs = [b[r] for i in range(start, stop) for b in cache.buffers(i)]
        io = session.io_binding()
        for j, i in enumerate(range(start, stop)):
            for name, b in zip(("key", "value"), bufs[2 * j : 2 * j + 2], strict=True):
                for bind, kind in ((io.bind_input, "past"), (io.bind_output, "present")):
                    bind(f"{kind}.{i}.{name}", "cpu", 0, np.float32, list(b.shape),
                         b.ctypes.data)  # fmt: skip
        self._bindings[key] = ((cache.layout, r.stop), io)
        return io

    @staticmethod
    def _run_window(session, outs, names, x, pos, m, lm, past, start, stop, off, rows_):
        """One graph run of the whole pass (recipe attention "window")."""
        B, T = x.shape[:2]
        # GroupQueryAttention's CPU kernel runs a multi-token window over a past one row at a
        # time: such a batch (branch rows verified together) runs row by row
        rows = [slice(r, r + 1) for r in range(B)] if B > 1 and T > 1 and off else [slice(None)]
        got = []
        for r in rows:
            feed = {**_carried(start, x[r]), "position_ids": pos[r]}
            if "attention_mask" in names:
                feed["attention_mask"] = m[r]
            if lm is not None:
                feed["local_mask"] = lm[r]
            if "head_rows" in names:
                feed["head_rows"] = np.array(rows_, np.int64)
            for i, (k, v) in zip(range(start, stop), past, strict=True):
                feed[f"past.{i}.key"] = np.ascontiguousarray(k[r])
                feed[f"past.{i}.value"] = np.ascontiguousarray(v[r])
            got.append(session.run(outs, feed))
        return got[0] if len(got) == 1 else [np.concatenate(p) for p in zip(*got, strict=True)]

    # set by a fitted head's draft (--draft head, runtime/drafts/head/torch.py): the outputs
    # of these layers, concatenated, are kept on the cache (record_rows) for it to read
    record_hidden = False
    record_layers: tuple[int, ...] | None = None
    last_cache = None  # the cache of the last recording forward
    hidden_norm = None  # an MTP head's: the checkpoint's final norm, in PyTorch (its twin's)

    def forward(self, tokens, cache, *, positions=None, mask=None, last=None) -> np.ndarray:
        """Logits (B, T, V), or of the last `last` positions only (B, last, V)."""
        ids = check_tokens(tokens, self.config.vocab_size)
        if self.record_hidden and (self.record_layers or self.hidden_norm is not None):
            # a fitted head reads its taps, an MTP head the normed last hidden state
            return forward_recording(self, ids, cache, positions, mask, last)
        logits, _hidden = self._run(ids, cache, 0, self.config.num_layers, True, positions, mask,
                                    last)  # fmt: skip
        return logits

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        n = self.config.num_layers
        if not 0 <= start < stop <= n:
            raise DuetError(f"layer range [{start}, {stop}) outside 0..{n}")
        if start == 0:
            x = check_tokens(x, self.config.vocab_size)
        else:
            x = Residual.of(x)
        return Residual(*self._run(x, cache, start, stop, False, positions, mask))

    def head(self, hidden) -> np.ndarray:
        """Logits of a hidden state from forward_layers (a Residual: the head adds and normalises
        it as the whole graph does) or of a plain one."""
        session, outs, _ = self._part(self.config.num_layers, self.config.num_layers, True)
        h = Residual.of(hidden)
        if h.shape[0] * h.shape[1] == 1 and one_row_apart():  # ONE_ROW: the row twice
            twice = Residual(np.concatenate([h.h, h.h], 1), np.concatenate([h.resid] * 2, 1))
            return session.run(outs, twice.feed())[0][:, :1]
        return session.run(outs, h.feed())[0]
