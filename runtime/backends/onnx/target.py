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

Threads: `intra_threads` ONNX Runtime intra-op threads for every part (runtime/loading.py gives
the target all the cores a draft leaves, both of two for the draft-free methods).

Here: the recipe, the cached parts and the pass (how it is cut, padded and put in the cache);
beside it, target_window.py (one graph run under "window": in place over the buffers, or fed),
target_tree.py (a tree's pass as chains), target_rows.py (the feed under "rows") and
residual.py (the hidden state between parts, the one-row padding).
"""

from __future__ import annotations

import json
import sys
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
from runtime.backends.onnx.target_tree import tree_as_chains
from runtime.backends.onnx.target_window import (
    GraphPass,
    first_present,
    kept_rows,
    run_in_place,
    run_window,
)
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
    return {
        "scheme": quantize,
        "op": "MatMulNBits",
        "bits": bits,
        "block_size": BLOCK_SIZE,
        "symmetric": True,
        "accuracy_level": LEVELS[ATTENTION],
        "head_bits": 8,
        "head_accuracy_level": HEAD_ACCURACY_LEVEL,
        "int8_as": "one 8-bit MatMulNBits (a VNNI CPU)"
        if int8_dot()
        else "two 4-bit MatMulNBits (hi/lo nibbles of symmetric int8 blocks)",
        "grid": bits == 4,  # weights on a GGUF Q4_0/Q4_1/Q4_K block grid kept exactly
        # their block sums as more columns of the same MatMulNBits (int8-rounded at level 4)
        "grid_sums": "fused columns" if bits == 4 else None,
        "source": "weights on a 4-bit block grid (a GGUF's Q4_0/Q4_1/Q4_K) kept exactly "
        "(converters/onnx_grid_q4.py); others requantized from the float32 weights",
        # a GGUF stored them at 5, 6 or 8 bits (Q5_0, Q6_K, Q8_0: most of a Q4_K_M file);
        # 4 bits would lose what llama.cpp keeps (Gemma 3 270M: 71 % top-1 agreement)
        "gguf_finer": "8 bits" if bits == 4 else None,
        "embedding": "float32",
        **rows,
    }


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


def ensure_part(
    d: Path, quantize: str, start: int, stop: int, head: bool, n: int, taps: tuple = ()
) -> Path:
    """The cached graph of one part, exported on first use (made once, redone when older than
    the checkpoint's weights)."""
    from runtime.backends.exporters import export  # converters/ registers the exporter

    out = part_path(d, quantize, part_name(start, stop, n, head, taps))
    if is_stale(out, Path(d).glob("*.safetensors")):
        what = f"{Path(d).name} ({quantize}, {part_name(start, stop, n, head, taps)})"
        say = f"[building the ONNX target of {what} once; later runs load it from {out.parent}]"
        print(say, file=sys.stderr)
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

    def __init__(
        self, ckpt_dir, quantize: str = "int4", intra_threads: int = 2, provider: str = "cpu"
    ):
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
        self._bindings: dict[tuple, tuple] = {}  # kept KV bindings (target_window.kv_binding)
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
            s = open_session(
                p, self.provider, self.threads, 1, spin=(start, stop, head) == (0, n, True)
            )
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
            return SlidingKVCache(
                self.sliding, c.sliding_window, batch, empty, lambda b: np.zeros((b, 0), np.int64)
            )
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
        key_pos = np.concatenate(
            [np.broadcast_to(held[0], (pos.shape[0], held[0].shape[1])), pos], axis=1
        )
        S = key_pos.shape[1]
        near = key_pos[:, None, :] > pos[:, :, None] - self.config.sliding_window
        return np.ascontiguousarray(m[..., -S:] & near), key_pos

    def _run(
        self,
        x,
        cache,
        start: int,
        stop: int,
        head: bool,
        positions,
        mask,
        last=None,
        taps: tuple = (),
    ):
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
            return tree_as_chains(self, x, cache, start, stop, head, pos, m, off, last, taps)
        if rows:  # a long pass: chunk by chunk, each over the keys the ones before it put
            n = chunk_rows(off, T)
            bounds = list(range(0, T, n))
        else:  # KEY_BUCKETS: cut before each position where GQA's sums change
            bounds = [0] + [c - off for c in self._key_cuts() if off < c < off + T]
        if len(bounds) > 1:
            want = T if last is None or not head else min(last, T)  # logits of the last `want`
            got = []
            for a, b in zip(bounds, [*bounds[1:], T], strict=True):
                got.append(
                    self._run(
                        x[:, a:b],
                        cache,
                        start,
                        stop,
                        head,
                        pos[:, a:b],
                        m[:, a:b, : off + b],
                        max(0, min(b - a, b - (T - want))),
                        taps,
                    )
                )
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
        run = GraphPass(
            session, outs, names, x, pos, m, start, stop, head, off, (lo, hi), keep, cut, taps
        )
        if isinstance(cache, BufferKVCache) and not rows:
            return run_in_place(self, run, cache)
        past = [cache.get(i)[:2] for i in range(start, stop)]
        lm, key_pos = self._local_mask(cache, start, stop, pos, m) if self.sliding else (None,) * 2
        if rows:
            feed = {**_carried(start, x), "position_ids": pos}
            if "head_rows" in names:
                feed["head_rows"] = np.array([lo, hi], np.int64)
            for tag, mm in (("", m if "kv_index" in names else None), ("local_", lm)):
                if mm is not None:
                    idx, seqlens, gm = row_feed(mm, self.config.num_kv_heads)
                    feed.update(
                        {f"{tag}kv_index": idx, f"{tag}seqlens_k": seqlens, f"{tag}gqa_mask": gm}
                    )
            for i, (k, v) in zip(range(start, stop), past, strict=True):
                feed[f"past.{i}.key"] = np.ascontiguousarray(k)
                feed[f"past.{i}.value"] = np.ascontiguousarray(v)
            res = session.run(outs, feed)
        else:
            res = run_window(run, lm, past)
        first = first_present(outs)
        drop = T - keep  # a padded pass's second column is dropped
        for j, i in enumerate(range(start, stop)):
            k, v = res[first + 2 * j], res[first + 2 * j + 1]
            kv = (k[:, :, : k.shape[2] - drop], v[:, :, : v.shape[2] - drop])
            if self.sliding and self.sliding[i]:
                cache.put(i, *kv, key_pos[:, : key_pos.shape[1] - drop])
            else:
                cache.put(i, *kv)
        return kept_rows(res[:first], head, keep, cut)

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
        logits, _hidden = self._run(
            ids, cache, 0, self.config.num_layers, True, positions, mask, last
        )
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
