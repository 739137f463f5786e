"""One graph run of an ONNX target pass under the recipe's attention "window"
(runtime/backends/onnx/target.py): in place over the preallocated buffer cache
(runtime/caches/buffer.py, each layer's buffer bound as both its past and its present through a
kept IOBinding), or fed the past as arrays (any other cache); and the two cuts every run's
outputs take (where the presents start, which rows are kept)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.backends.onnx.residual import _carried


def first_present(outs: list[str]) -> int:
    """How many of a part's outputs come before its presents: (logits, hidden[, taps]) or
    (hidden, resid) (a Residual)."""
    return next((j for j, o in enumerate(outs) if o.startswith("present.")), len(outs))


def kept_rows(res: list, head: bool, keep: int, cut: slice) -> list:
    """A pass's outputs without a padded one-token pass's second row, the logits cut to the rows
    asked for (`cut` of the head's rows, which ONE_ROW may have widened)."""
    return [a[:, cut] if head and j == 0 else a[:, :keep] for j, a in enumerate(res)]


@dataclass
class GraphPass:
    """One graph run of a pass, as OnnxTargetLM._run has laid it out: its part (session, output
    and input names), the tokens or hidden state x (B, T[, C]), positions (B, T), mask
    (B, T, off + T), layers [start, stop) over the cache's offset `off`, and with `head` the
    head's rows [rows[0], rows[1]), the `keep` rows kept, the logits' `cut` and the taps."""

    session: object
    outs: list[str]
    names: list[str]
    x: np.ndarray
    pos: np.ndarray
    m: np.ndarray
    start: int
    stop: int
    head: bool
    off: int
    rows: tuple[int, int]
    keep: int
    cut: slice
    taps: tuple = ()


def run_in_place(target, p: GraphPass, cache):
    """One graph run of `target`'s (an OnnxTargetLM) whole pass with each layer's buffer bound
    as both its past and its present: the kernel appends the pass's keys and values at `off` in
    place (runtime/caches/buffer.py); logits and hidden are written into arrays made here. The
    offsets advance by `keep` (a padded one-token pass's second column is left stale)."""
    session, outs, names, x, pos, m = p.session, p.outs, p.names, p.x, p.pos, p.m
    start, stop, head, off, keep, taps = p.start, p.stop, p.head, p.off, p.keep, p.taps
    B, T = x.shape[:2]
    for i in range(start, stop):
        cache.reserve(i, off + T)
    lm = None  # Gemma 3's local layers: the mask within their window, columns as positions
    if any(target.sliding[start:stop]):
        near = np.arange(off + T)[None, None, :] > pos[:, :, None] - target.config.sliding_window
        lm = m & near
    first = first_present(outs)
    C = target.config.hidden_size
    widths = {"logits": target.config.vocab_size, "hidden": C, "resid": C,
              "taps": C * len(taps)}  # fmt: skip
    got = [
        np.empty((B, p.rows[1] - p.rows[0] if n == "logits" else T, widths[n]), np.float32)
        for n in outs[:first]
    ]
    # the CPU kernel runs a multi-token window over a past one batch row at a time
    rows = [slice(r, r + 1) for r in range(B)] if B > 1 and T > 1 and off else [slice(None)]
    for r in rows:
        io = kv_binding(target._bindings, session, cache, start, stop, r)
        for name, arr in _carried(start, x[r]).items():
            io.bind_cpu_input(name, np.ascontiguousarray(arr))
        io.bind_cpu_input("position_ids", np.ascontiguousarray(pos[r]))
        if "attention_mask" in names:  # a part of local layers only takes local_mask
            io.bind_cpu_input("attention_mask", np.ascontiguousarray(m[r]))
        if lm is not None and "local_mask" in names:
            io.bind_cpu_input("local_mask", np.ascontiguousarray(lm[r]))
        if head:
            io.bind_cpu_input("head_rows", np.array(p.rows, np.int64))
        for name, arr in zip(outs[:first], got, strict=True):
            a = arr[r]
            io.bind_output(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
        session.run_with_iobinding(io)
    for i in range(start, stop):
        cache.advance(i, keep)
    return kept_rows(got, head, keep, p.cut)


def kv_binding(bindings: dict, session, cache, start: int, stop: int, r: slice):
    """An IOBinding with layers [start, stop)'s buffers (row r) bound as their past and
    present, kept while those buffers stay where they are: binding 60 of them anew cost
    ~1 ms a step on SmolLM2 (a 15 ms step). The cache's layout token (unique in the
    process, new whenever a buffer is replaced) says they have not moved, without reading
    60 views' addresses a step (`bindings`: the target's, by part and row). The caller rebinds
    the pass's own inputs."""
    key = (id(session), start, stop, r.start)
    kept = bindings.get(key)
    if kept is not None and kept[0] == (cache.layout, r.stop):
        return kept[1]
    bufs = [b[r] for i in range(start, stop) for b in cache.buffers(i)]
    io = session.io_binding()
    for j, i in enumerate(range(start, stop)):
        for name, b in zip(("key", "value"), bufs[2 * j : 2 * j + 2], strict=True):
            for bind, kind in ((io.bind_input, "past"), (io.bind_output, "present")):
                bind(f"{kind}.{i}.{name}", "cpu", 0, np.float32, list(b.shape), b.ctypes.data)
    bindings[key] = ((cache.layout, r.stop), io)
    return io


def run_window(p: GraphPass, lm, past):
    """One graph run of the whole pass (recipe attention "window"), fed `past` (the layers'
    keys and values) and `lm` (the local layers' mask, or None)."""
    session, outs, names, x, pos, m = p.session, p.outs, p.names, p.x, p.pos, p.m
    B, T = x.shape[:2]
    # GroupQueryAttention's CPU kernel runs a multi-token window over a past one row at a
    # time: such a batch (branch rows verified together) runs row by row
    rows = [slice(r, r + 1) for r in range(B)] if B > 1 and T > 1 and p.off else [slice(None)]
    got = []
    for r in rows:
        feed = {**_carried(p.start, x[r]), "position_ids": pos[r]}
        if "attention_mask" in names:
            feed["attention_mask"] = m[r]
        if lm is not None:
            feed["local_mask"] = lm[r]
        if "head_rows" in names:
            feed["head_rows"] = np.array(p.rows, np.int64)
        for i, (k, v) in zip(range(p.start, p.stop), past, strict=True):
            feed[f"past.{i}.key"] = np.ascontiguousarray(k[r])
            feed[f"past.{i}.value"] = np.ascontiguousarray(v[r])
        got.append(session.run(outs, feed))
    return got[0] if len(got) == 1 else [np.concatenate(p) for p in zip(*got, strict=True)]
