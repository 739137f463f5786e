"""Where the target runs when nobody named a backend: measured once per model and machine.

runtime/placement.py lists the machine's candidates for a checkpoint (`target_candidates`: the
fidelity rule leaves one for a GGUF, ONNX Runtime from its own blocks, and two for a float
checkpoint on a CPU, PyTorch and ONNX Runtime in float32). Where there are several, this probe
loads each in turn, prefills 64 tokens, and times a one-token pass (an `ar` step) and a
five-token pass (an `sd` verify window), interleaved and repeated (pair_stages._medians); the
candidate whose two passes cost least runs. Only one model is held at a time: a loser is
dropped before the next loads (a probe never needs twice a model's memory).

The choice is kept as auto's method costs are (devices/probe_store.py: one small JSON file per
checkpoint and machine, in the cache's `auto` folder, a week at most; `--reprobe` measures
again), so a later run loads the chosen backend at once. `announce` is True only for a choice
made now: the command says what it chose and why once, not on every run.
"""

from __future__ import annotations

import gc

import numpy as np

from devices.pair_stages import _medians
from devices.probe_store import ProbeStore

WINDOWS = (1, 5)  # tokens per timed pass: an ar step, an sd verify window (γ = 4)
PREFILL = 64  # tokens in the cache the passes attend to
REPEATS = 7


def pass_costs(target) -> dict[int, float]:
    """{tokens: median seconds} of a pass over `tokens` new tokens after a PREFILL-token prompt."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, target.config.vocab_size, size=(1, PREFILL), dtype=np.int64)
    cache = target.new_cache()
    target.forward(prompt, cache)
    fns = {}
    for n in WINDOWS:

        def one(x=prompt[:, :n]):
            target.forward(x, cache)
            cache.trim(x.shape[1])

        fns[n] = one
    return _medians(fns, REPEATS)


def _label(backend: str, quantize: str) -> str:
    return f"{backend}" + ("" if quantize in ("none", None) else f" {quantize}")


def choose_target(tdir, candidates, load, *, refresh: bool = False):
    """runtime.loading's `target_chooser`: (backend, quantize, why, announce, the loaded
    target or None) among `candidates` [(backend, quantize, why)]; `load(backend, quantize)`
    loads one."""
    extra = [[b, q] for b, q, _ in candidates]
    store = ProbeStore.for_checkpoint(tdir, "placement", extra, refresh=refresh)
    kept = store.load() if store is not None else None
    if kept and [kept.get("backend"), kept.get("quantize")] in extra:
        return kept["backend"], kept["quantize"], kept["why"], False, None
    if len(candidates) == 1:
        (backend, q, why), model = candidates[0], None
    else:
        backend, q, why, model = _measure(candidates, load)
    if store is not None:
        why_kept = f"{why}; kept in {store.path}, --reprobe measures again"
        store.save({"backend": backend, "quantize": q, "why": why_kept})
    return backend, q, why, True, model


def _measure(candidates, load):
    """(backend, quantize, why, the winner's model or None): each candidate loaded, timed and
    dropped in turn; the last one is kept when it wins."""
    costs, model = {}, None
    for i, (backend, q, _) in enumerate(candidates):
        model = load(backend, q)
        costs[i] = pass_costs(model)
        if i < len(candidates) - 1:
            model = None
            gc.collect()
    best = min(costs, key=lambda i: sum(costs[i].values()))
    backend, q, why = candidates[best]
    shown = ", ".join(
        f"{_label(b, qq)} {costs[i][1] * 1e3:.1f}/{costs[i][5] * 1e3:.1f} ms"
        for i, (b, qq, _) in enumerate(candidates)
    )
    why = f"{why}, measured fastest here (1-/5-token pass: {shown})"
    return backend, q, why, model if best == len(candidates) - 1 else None
