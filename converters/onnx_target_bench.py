"""What a verify pass costs on the ONNX target: one forward of w tokens over a context of C
tokens, for each window w (1 and γ + 1 = 5 by default), through OnnxTargetLM as the decoding
methods call it (host feed, KV concat, graph, cache put), the cache trimmed back after each.

Medians over `repeats` rounds, the windows interleaved round by round so that a machine whose
load drifts biases none against the others; the ratio to the one-token pass is issue 41's
"a (γ+1)-token pass costs <= 1.3x a one-token pass at γ = 4". On a machine shared with other
work the wall times are taken under load: say so beside them. The process's CPU time per pass
is kept beside them (`cpu_seconds`): with one intra-op thread it is the pass's own work, which
other processes preempt but do not add to (they still share the memory system); with more,
it also counts the thread pool's spinning.
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def window_seconds(lm, context, windows, repeats: int, *, seed: int = 0):
    """({window: median wall seconds}, {window: median CPU seconds}) of lm.forward over `context`
    (ids, (1, C)) already in a fresh cache: the windows interleaved round by round, the cache
    trimmed back after each, two rounds of warm-up."""
    v = lm.config.vocab_size
    rng = np.random.default_rng(seed)
    cache = lm.new_cache()
    lm.forward(np.asarray(context).reshape(1, -1), cache)
    feeds = {w: rng.integers(0, v, (1, w)) for w in windows}
    times: dict[int, list[float]] = {w: [] for w in windows}
    cpu: dict[int, list[float]] = {w: [] for w in windows}
    for r in range(repeats + 2):
        for w in windows:
            t0, c0 = time.perf_counter(), time.process_time()
            lm.forward(feeds[w], cache)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            assert cache.trim(w) == w
            if r >= 2:
                times[w].append(dt)
                cpu[w].append(dc)
    return (
        {w: statistics.median(t) for w, t in times.items()},
        {w: statistics.median(t) for w, t in cpu.items()},
    )


def pass_costs(
    model_dir,
    quantize: str = "int4",
    *,
    context: int = 200,
    windows: tuple[int, ...] = (1, 5),
    repeats: int = 30,
    threads: int = 2,
) -> dict:
    """{window: median seconds} and each one's ratio to the smallest window's."""
    from runtime.backends.onnx.target import OnnxTargetLM

    lm = OnnxTargetLM(model_dir, quantize, intra_threads=threads)
    rng = np.random.default_rng(0)
    med, mcpu = window_seconds(
        lm, rng.integers(0, lm.config.vocab_size, (1, context)), windows, repeats
    )
    base, cbase = med[min(windows)], mcpu[min(windows)]
    return {
        "model": str(model_dir),
        "quantize": quantize,
        "context": context,
        "threads": threads,
        "repeats": repeats,
        "seconds": {str(w): med[w] for w in windows},
        "ratio": {str(w): med[w] / base for w in windows},
        "cpu_seconds": {str(w): mcpu[w] for w in windows},
        "cpu_ratio": {str(w): mcpu[w] / cbase for w in windows},
        "recipe": lm.quantization,
    }
