"""The target on ONNX Runtime: exported graph parts, int4/int8 weights, KV cache as explicit I/O.

`OnnxTargetLM` is the CausalLM protocol over the parts that converters/onnx_target_export.py
writes (`full`: ids -> logits + hidden; `layers.a.b`; `head`). Each part is exported once, on
the first call that needs it, and cached beside the checkpoint in `<dir>/.duet/` under a name
keyed by the quantization, its recipe's hash and the layer range
(`target-int4-1a2b3c4d-full.onnx`); a later run opens
the cached file. Positions and a boolean mask (B, T, past + T) are what every pass takes, so
causal windows, tree masks and branch rows all run (under the recipe's attention "rows" every
pass goes to the graph as rows, one a token: runtime/backends/onnx_target_rows.py, so that at
int8 activations it equals one-token passes bit for bit); rollback moves the host cache's offset,
as on the other backends. Under "window" that cache is preallocated buffers
(runtime/buffer_cache.py) bound as both each layer's past and its present, so the attention
kernel appends a pass's keys in place and no step copies the past (runtime/cache.py's
concatenating cache under "rows"; Gemma 3's sliding cache for its local layers). Layer ranges (Mirror-SD's early exit) run the
`layers.0.E` part, `head` on its hidden state, then `layers.E.N` and `head`: hidden states
stay NumPy between parts. Gemma 3's local layers hold only their window and a slack
(runtime/sliding_cache.py): their attention reads a local mask, which the host builds from the
mask and the held columns' positions, and the host keeps those positions for the cache.

Threads: `intra_threads` ONNX Runtime intra-op threads for every part (runtime/load.py gives
the target all the cores a draft leaves, both of two for the draft-free methods).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from runtime.backends.onnx_target_rows import chunk_rows, row_feed
from runtime.buffer_cache import BufferKVCache
from runtime.cache import ConcatKVCache
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens, default_positions
from runtime.sliding_cache import SlidingKVCache

QUANTIZE = ("int4", "int8", "none")
BLOCK_SIZE = 32
# How attention runs, and with it MatMulNBits' compute type (accuracy level) on the layers:
# "window": GroupQueryAttention over the whole pass, the layers at 1 (float32 compute).
# "rows": every token its own row (converters/onnx_target_rows.py), the layers at 4 (int8
#   activations). At 4 a last-bit difference in attention grows through the layers, and GQA's
#   window path sums in another order than its one-token path (SmolLM2-135M int4: a 5-token pass
#   and five 1-token passes 0.84 logits apart, greedy sd left ar); as rows every pass gives a
#   token bit for bit what a one-token pass gives, so sd, tree and mirror equal ar. It costs a
#   gather of the keys each row sees, quadratic in a prefill's length (sd's first pass holds the
#   prompt and the first drafts, so the prefill must run as rows too): on SmolLM2 under load a
#   5-token pass over 200 drops from ~2.3x to ~2.0x a one-token pass, the one-token pass stays
#   the same, and a 200-token prefill costs 2.2 s against 1.1 s (800 tokens: 16.6 s against
#   4.3 s). Hence "window" stays the default.
# The LM head (49,152 columns) runs at 4 under both: its passes agree, and its 4-bit halves
# (converters/onnx_head_split.py) sum pairs to at most 2 * 15 * 128, which no kernel (AVX2
# without VNNI sums pairs in a saturating int16, VPMADDUBSW) can clip.
ATTENTION = "window"
LEVELS = {"window": 1, "rows": 4}
HEAD_ACCURACY_LEVEL = 4


def recipe(quantize: str) -> dict:
    """What `quantize` means, as stored in the graph's metadata."""
    if quantize not in QUANTIZE:
        raise DuetError(f"unknown --quantize {quantize!r}; choose from {', '.join(QUANTIZE)}")
    # "window" graphs keep the recipe they had before rows existed (their caches stay valid);
    # the number after "rows" moves when the rows graph does
    rows = {"attention": "rows-2"} if ATTENTION == "rows" else {"present": "in-place"}
    rows["last_rows"] = True  # the head can run on a pass's last rows only (a prefill's one)
    if quantize == "none":
        return {"scheme": "none", **rows}
    bits = 4 if quantize == "int4" else 8
    return {"scheme": quantize, "op": "MatMulNBits", "bits": bits, "block_size": BLOCK_SIZE,
            "symmetric": True, "accuracy_level": LEVELS[ATTENTION], "head_bits": 8,
            "head_accuracy_level": HEAD_ACCURACY_LEVEL,
            "int8_as": "two 4-bit MatMulNBits (hi/lo nibbles of symmetric int8 blocks)",
            "grid": bits == 4,  # weights on a GGUF Q4_0/Q4_1/Q4_K block grid kept exactly
            "source": "weights on a 4-bit block grid (a GGUF's Q4_0/Q4_1/Q4_K) kept exactly "
            "(converters/onnx_grid_q4.py); others requantized from the float32 weights",
            # a GGUF stored them at 5, 6 or 8 bits (Q5_0, Q6_K, Q8_0: most of a Q4_K_M file);
            # 4 bits would lose what llama.cpp keeps (Gemma 3 270M: 71 % top-1 agreement)
            "gguf_finer": "8 bits" if bits == 4 else None,
            "embedding": "float32", **rows}  # fmt: skip


def part_name(start: int, stop: int, num_layers: int, head: bool) -> str:
    if head and start == 0 and stop == num_layers:
        return "full"
    if start == stop and head:
        return "head"
    return f"layers.{start}.{stop}"


def part_path(d: Path, quantize: str, name: str) -> Path:
    """Where a part is cached: keyed by the quantization and a hash of its recipe, so a changed
    recipe (block size, accuracy level) exports afresh instead of reusing a stale file."""
    import hashlib

    tag = hashlib.sha1(json.dumps(recipe(quantize), sort_keys=True).encode()).hexdigest()[:8]
    return Path(d) / ".duet" / f"target-{quantize}-{tag}-{name}.onnx"


def ensure_part(d: Path, quantize: str, start: int, stop: int, head: bool, n: int) -> Path:
    """The cached graph of one part, exported on first use (made once, redone when older than
    the checkpoint's weights)."""
    from runtime.backends.exporters import export  # converters/ registers the exporter

    out = part_path(d, quantize, part_name(start, stop, n, head))
    weights = list(Path(d).glob("*.safetensors"))
    newest = max((f.stat().st_mtime for f in weights), default=0)
    if not out.is_file() or out.stat().st_mtime < newest:
        try:
            export("onnx-target", d, out, start, stop, head, quantize, source=d)
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
                          {"quantize": quantize, "intra_threads": intra_threads})  # fmt: skip
        self._sessions: dict[tuple, object] = {}
        self.session = self._part(0, self.config.num_layers, True)  # exported/opened at load

    def _part(self, start: int, stop: int, head: bool):
        key = (start, stop, head)
        if key not in self._sessions:
            from runtime.backends.onnx_backend import open_session

            n = self.config.num_layers
            p = ensure_part(self.dir, self.quantize, start, stop, head, n)
            s = open_session(p, self.provider, self.threads, 1)
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
        if any(self.sliding):  # Gemma 3: local layers keep their window (runtime/sliding_cache.py)
            return SlidingKVCache(self.sliding, c.sliding_window, batch, empty,
                                  lambda b: np.zeros((b, 0), np.int64))  # fmt: skip
        if ATTENTION == "window":  # written in place by the kernel (runtime/buffer_cache.py)
            return BufferKVCache(c.num_layers, batch, c.num_kv_heads, c.head_dim, c.max_context)
        return ConcatKVCache(c.num_layers, batch, empty)

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

    def _run(self, x, cache, start: int, stop: int, head: bool, positions, mask, last=None):
        """[logits (B, min(last, T), V) when `head`,] hidden (B, T, C): `last` cuts the head to the
        pass's last rows (a prefill's 1), where the graph takes `last_rows`."""
        B, T = x.shape[:2]
        off = cache.layer_offset(start)
        pos = default_positions(off, B, T) if positions is None else np.asarray(positions)
        pos = np.ascontiguousarray(np.broadcast_to(pos, (B, T)), dtype=np.int64)
        m = causal_mask(off, T) if mask is None else np.asarray(mask, dtype=bool)
        m = np.ascontiguousarray(np.broadcast_to(m, (B, T, off + T)))
        session, outs, names = self._part(start, stop, head)
        rows = "kv_index" in names or "local_kv_index" in names  # recipe attention "rows"
        n = chunk_rows(off, T) if rows else T
        if T > n:  # a long pass: chunk by chunk, each over the keys the ones before it put
            got = [self._run(x[:, a : a + n], cache, start, stop, head, pos[:, a : a + n],
                             m[:, a : a + n, : off + a + n]) for a in range(0, T, n)]  # fmt: skip
            res = [np.concatenate(parts, axis=1) for parts in zip(*got, strict=True)]
            return [res[0][:, -last:], *res[1:]] if head and last else res  # a cut after all
        last = min(last, T) if head and last else T  # rows of logits (graphs with last_rows)
        if isinstance(cache, BufferKVCache) and not rows and not self.sliding:
            return self._run_in_place(session, outs, x, pos, m, cache, start, stop, head, off,
                                      last)  # fmt: skip
        past = [cache.get(i)[:2] for i in range(start, stop)]
        lm, key_pos = self._local_mask(cache, start, stop, pos, m) if self.sliding else (None,) * 2
        if rows:
            feed = {"input_ids" if start == 0 else "hidden_in": x, "position_ids": pos}
            if "last_rows" in names:
                feed["last_rows"] = np.array([last], np.int64)
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
                                   last)  # fmt: skip
        first = 2 if head else 1
        for j, i in enumerate(range(start, stop)):
            kv = (res[first + 2 * j], res[first + 2 * j + 1])
            cache.put(i, *kv, key_pos) if self.sliding and self.sliding[i] else cache.put(i, *kv)
        return res[:first]

    def _run_in_place(self, session, outs, x, pos, m, cache, start, stop, head, off, last):
        """One graph run of the whole pass with each layer's buffer bound as both its past and
        its present: the kernel appends the pass's keys and values at `off` in place
        (runtime/buffer_cache.py); logits and hidden are written into arrays made here."""
        B, T = x.shape[:2]
        for i in range(start, stop):
            cache.reserve(i, off + T)
        first = 2 if head else 1
        widths = {"logits": self.config.vocab_size, "hidden": self.config.hidden_size}
        rows_out = {"logits": last, "hidden": T}
        got = [np.empty((B, rows_out[n], widths[n]), np.float32) for n in outs[:first]]
        # the CPU kernel runs a multi-token window over a past one batch row at a time
        rows = [slice(r, r + 1) for r in range(B)] if B > 1 and T > 1 and off else [slice(None)]
        for r in rows:
            io = session.io_binding()
            io.bind_cpu_input(
                "input_ids" if start == 0 else "hidden_in", np.ascontiguousarray(x[r])
            )
            io.bind_cpu_input("position_ids", np.ascontiguousarray(pos[r]))
            io.bind_cpu_input("attention_mask", np.ascontiguousarray(m[r]))
            if head:
                io.bind_cpu_input("last_rows", np.array([last], np.int64))
            for i in range(start, stop):
                for name, buf in zip(("key", "value"), cache.buffers(i), strict=True):
                    b = buf[r]  # a contiguous view: the batch is the outer axis
                    for bind, kind in ((io.bind_input, "past"), (io.bind_output, "present")):
                        bind(f"{kind}.{i}.{name}", "cpu", 0, np.float32, list(b.shape),
                             b.ctypes.data)  # fmt: skip
            for name, arr in zip(outs[:first], got, strict=True):
                a = arr[r]
                io.bind_output(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
            session.run_with_iobinding(io)
        for i in range(start, stop):
            cache.advance(i, T)
        return got

    @staticmethod
    def _run_window(session, outs, names, x, pos, m, lm, past, start, stop, off, last):
        """One graph run of the whole pass (recipe attention "window")."""
        B, T = x.shape[:2]
        # GroupQueryAttention's CPU kernel runs a multi-token window over a past one row at a
        # time: such a batch (branch rows verified together) runs row by row
        rows = [slice(r, r + 1) for r in range(B)] if B > 1 and T > 1 and off else [slice(None)]
        got = []
        for r in rows:
            feed = {"input_ids" if start == 0 else "hidden_in": x[r], "position_ids": pos[r]}
            if "attention_mask" in names:
                feed["attention_mask"] = m[r]
            if lm is not None:
                feed["local_mask"] = lm[r]
            if "last_rows" in names:
                feed["last_rows"] = np.array([last], np.int64)
            for i, (k, v) in zip(range(start, stop), past, strict=True):
                feed[f"past.{i}.key"] = np.ascontiguousarray(k[r])
                feed[f"past.{i}.value"] = np.ascontiguousarray(v[r])
            got.append(session.run(outs, feed))
        return got[0] if len(got) == 1 else [np.concatenate(p) for p in zip(*got, strict=True)]

    def forward(self, tokens, cache, *, positions=None, mask=None, last=None) -> np.ndarray:
        """Logits (B, T, V), or of the last `last` positions only (B, last, V)."""
        ids = check_tokens(tokens, self.config.vocab_size)
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
            x = np.ascontiguousarray(x, dtype=np.float32)
        (h,) = self._run(x, cache, start, stop, False, positions, mask)
        return h

    def head(self, hidden) -> np.ndarray:
        session, outs, _ = self._part(self.config.num_layers, self.config.num_layers, True)
        h = np.ascontiguousarray(hidden, dtype=np.float32)
        return session.run(outs, {"hidden_in": h})[0]
