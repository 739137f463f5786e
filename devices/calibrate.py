"""Calibration: measure the machine at hand with the real backends and fit a profile.

What is measured (medians over `repeats`), and what is fitted by least squares:

  draft step time against K     K greedy single-token draft forwards   T_edge(K) = α_edge·K + β
  target verification against K one forward over K + 1 positions + head
                                                                       T_cloud(K) = T_base
                                                                                    + K·δ_cloud
  target per-layer time c_ℓ     each layer alone over a window of T    c_ℓ(T) ≈ c_layer
                                                                              + T·c_layer_per_token
  rendezvous                    a queue.Queue round trip between two    T_rv = T_rv(ee) + T_rv(fv)
                                threads carrying a top-κ payload
  contention                    the target's γ+1 window pass while a    target_slowdown (x)
                                draft thread loops branch passes beside
                                it, over the pass alone; one batched    draft_batch_step (s)
                                branch pass (devices.pair_stages)
  memory bandwidth, peak        a numpy copy and a float32 matmul

Models come from runtime.backends.load_model. Thread counts are whatever each
backend uses by default (ONNX Runtime: 1 intra-op thread, see OnnxCausalLM);
the written profile says so. This module does not decide defaults for the CLI.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.fit import LinearFit, fit_linear
from devices.pair_stages import measure_rendezvous


def _block(x) -> None:
    """Wait for a lazily evaluated hidden state (MLX); eager backends return finished work."""
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover - mlx is a dependency, but keep calibration importable
        return
    if isinstance(x, mx.array):
        mx.eval(x)


def _median_time(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _prompt(vocab_size: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab_size, size=(1, n), dtype=np.int64)


def _prefilled(model, prompt_len: int):
    """A fresh cache holding a random prompt of `prompt_len` tokens."""
    cache = model.new_cache(1)
    model.forward(_prompt(model.config.vocab_size, prompt_len), cache)
    return cache


def _median_per_k(k_values: Iterable[int], make, repeats: int) -> dict[int, float]:
    """{K: median seconds of make(K)()}, each after one warm-up call (graph compilation,
    allocator)."""
    out = {}
    for k in k_values:
        fn = make(k)
        fn()
        out[k] = _median_time(fn, repeats)
    return out


def time_draft_steps(
    model, k_values: Iterable[int], *, prompt_len: int = 16, repeats: int = 3
) -> dict[int, float]:
    """Median seconds to draft K tokens greedily, one forward per token, after a prefill."""
    cache = _prefilled(model, prompt_len)

    def drafter(k: int):
        def draft():
            tok = np.zeros((1, 1), dtype=np.int64)
            for _ in range(k):
                logits = model.forward(tok, cache)  # (1, 1, V)
                tok = logits[:, -1:].argmax(-1).astype(np.int64)
            cache.trim(k)

        return draft

    return _median_per_k(k_values, drafter, repeats)


def time_verify(
    model, k_values: Iterable[int], *, prompt_len: int = 16, repeats: int = 3
) -> dict[int, float]:
    """Median seconds for one target forward + head over a window of K + 1 positions."""
    cache = _prefilled(model, prompt_len)

    def verifier(k: int):
        window = _prompt(model.config.vocab_size, k + 1, seed=k)

        def verify():
            model.forward(window, cache)
            cache.trim(window.shape[1])

        return verify

    return _median_per_k(k_values, verifier, repeats)


def time_layers(
    model, windows: Iterable[int], *, prompt_len: int = 16, repeats: int = 3
) -> dict[int, list[float]]:
    """Median seconds of each decoder layer alone over a window of T positions: {T: [c_0 .. c_N-1]}.

    A model without layer ranges (an ONNX graph) is timed whole and split evenly.
    """
    n = model.config.num_layers
    cache = _prefilled(model, prompt_len)
    out = {}
    for t in windows:
        tokens = _prompt(model.config.vocab_size, t, seed=t)
        runs: list[list[float]] = []
        for r in range(repeats + 1):  # the first run warms up
            per_layer = []
            if model.supports_layer_range:
                h = tokens
                for layer in range(n):
                    t0 = time.perf_counter()
                    h = model.forward_layers(h, cache, layer, layer + 1)
                    _block(h)
                    per_layer.append(time.perf_counter() - t0)
            else:
                t0 = time.perf_counter()
                model.forward(tokens, cache)
                per_layer = [(time.perf_counter() - t0) / n] * n
            cache.trim(t)
            if r:
                runs.append(per_layer)
        out[t] = [statistics.median(col) for col in zip(*runs, strict=True)]
    return out


def measure_bandwidth(n_bytes: int = 32 << 20, repeats: int = 3) -> float:
    """Copy bandwidth (bytes/s): best of `repeats` numpy copies, counting the read and the write."""
    src = np.ones(n_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = min(_median_time(lambda: np.copyto(dst, src), 1) for _ in range(repeats))
    return 2 * src.nbytes / best


def measure_peak(n: int = 512, repeats: int = 5) -> float:
    """float32 matmul throughput (FLOP/s): best of `repeats` n×n×n products."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    a @ b
    best = min(_median_time(lambda: a @ b, 1) for _ in range(repeats))
    return 2 * n**3 / best


@dataclass
class Calibration:
    """Raw measurements and fits of one calibration run."""

    draft: dict[int, float]
    verify: dict[int, float]
    layers: dict[int, list[float]]
    rendezvous_s: float
    bandwidth_Bps: float
    peak_flops: float
    fits: dict[str, LinearFit] = field(default_factory=dict)
    target_slowdown: float | None = None  # what `--method auto` needs for Mirror-SD
    draft_batch_s: float | None = None

    def fit(self) -> Calibration:
        """Least-squares fits of FlexSpec's and Mirror-SD's linear forms (see module docstring)."""
        ks = sorted(self.draft)
        self.fits["edge"] = fit_linear(ks, [self.draft[k] for k in ks])  # T_edge(K) = α_edge K + β
        ks = sorted(self.verify)
        self.fits["cloud"] = fit_linear(
            ks, [self.verify[k] for k in ks]
        )  # eq. (9) T_base + K δ_cloud
        ts = sorted(self.layers)
        mean_c = [float(np.mean(self.layers[t])) for t in ts]
        self.fits["layer"] = fit_linear(ts, mean_c)  # c_ℓ(T) = c0 + c1 T
        return self


def run_calibration(
    target,
    draft,
    *,
    k_max: int = 8,
    windows: tuple[int, ...] = (1, 2, 4, 8, 16),
    repeats: int = 3,
    progress: bool = True,
) -> Calibration:
    """Measure `target` and `draft` (loaded CausalLMs) and this host; return the fitted
    Calibration."""
    from tqdm import tqdm

    steps = [
        (
            "draft step time vs K",
            lambda: time_draft_steps(draft, range(1, k_max + 1), repeats=repeats),
        ),
        ("target verify vs K", lambda: time_verify(target, range(1, k_max + 1), repeats=repeats)),
        ("target c_l vs window", lambda: time_layers(target, windows, repeats=repeats)),
        ("rendezvous", measure_rendezvous),
        ("memory bandwidth", measure_bandwidth),
        ("peak FLOP/s", measure_peak),
    ]
    results = []
    bar = tqdm(steps, desc="calibrating", unit="stage", disable=not progress, leave=False)
    for label, fn in bar:
        bar.set_postfix_str(label)
        results.append(fn())
    cal = Calibration(*results).fit()
    if getattr(target, "supports_layer_range", None) is not None:
        from devices.pair_stages import measure_stages
        from runtime.mirror.draft_worker import DEFAULT_BRANCH_BATCH

        st = measure_stages(target, draft, gamma=4, branches=DEFAULT_BRANCH_BATCH, repeats=repeats)
        cal.target_slowdown, cal.draft_batch_s = st["target_slowdown"], st["draft_batch"]
    return cal


def host_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.node() or 'host'} ({platform.system()} {platform.machine()}, {cpu}, "
        f"{os.cpu_count()} cores)"
    )


def memory_capacity_bytes() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0.0


def to_profile(
    cal: Calibration,
    *,
    name: str,
    target_desc: str,
    draft_desc: str,
    target_backend: str,
    draft_backend: str,
    target_provider: str,
    draft_provider: str,
    target_quantize: str = "none",
) -> dict:
    """A profile dict (devices/profile.py schema) whose figures all say 'calibrated on <host>'."""
    host = host_description()
    on = f"calibrated on {host}"
    e, c, lay = cal.fits["edge"], cal.fits["cloud"], cal.fits["layer"]

    def fig(v, unit, how, fit: LinearFit | None = None):
        d = {"value": float(f"{v:.6g}"), "unit": unit, "source": f"{on}: {how}"}
        if fit is not None:
            d["r2"] = round(fit.r2, 4)
        return d

    ks = f"K = {min(cal.draft)}..{max(cal.draft)}"
    return {
        "name": name,
        "description": f"this machine, {host}; "
        f"target {target_desc} on {target_backend}/{target_provider}"
        f"{' ' + target_quantize if target_quantize != 'none' else ''}, "
        f"draft {draft_desc} on {draft_backend}/{draft_provider} (default backend threads)",
        "kind": "host",
        "memory": {
            "capacity": fig(memory_capacity_bytes() / 1e9, "GB", "os.sysconf physical pages"),
            "bandwidth": fig(
                cal.bandwidth_Bps / 1e9, "GB/s", "numpy copy, read + write bytes / time"
            ),
        },
        "accelerators": {
            "cpu": {
                "kind": "cpu",
                "peak": fig(cal.peak_flops / 1e12, "TFLOPS", "numpy float32 matmul 512^3"),
            }
        },
        "draft": {"accelerator": "cpu", "backend": draft_backend, "provider": draft_provider},
        "target": {"accelerator": "cpu", "backend": target_backend, "provider": target_provider}
        | ({"quantize": target_quantize} if target_quantize != "none" else {}),
        "latency": {
            "reference_draft": draft_desc,
            "reference_target": target_desc,
            "alpha_edge": fig(
                e.slope, "s", f"least squares T_edge(K) = alpha K + beta over {ks}", e
            ),
            "beta": fig(e.intercept, "s", f"least squares T_edge(K) = alpha K + beta over {ks}", e),
            "delta_cloud": fig(
                c.slope, "s", f"least squares T_cloud(K) = T_base + K delta over {ks}", c
            ),
            "t_base": fig(
                c.intercept, "s", f"least squares T_cloud(K) = T_base + K delta over {ks}", c
            ),
            "c_layer": fig(
                lay.intercept,
                "s",
                f"least squares mean c_l(T) = c0 + c1 T over T in {sorted(cal.layers)}",
                lay,
            ),
            "c_layer_per_token": fig(
                lay.slope,
                "s",
                f"least squares mean c_l(T) = c0 + c1 T over T in {sorted(cal.layers)}",
                lay,
            ),
            "t_rv": fig(
                cal.rendezvous_s,
                "s",
                "median queue.Queue round trip of a top-4 x 8 payload between two threads",
            ),
        }
        | (
            {}
            if cal.target_slowdown is None  # not measured, or the draft cannot run in a thread
            else {
                "target_slowdown": fig(
                    cal.target_slowdown,
                    "x",
                    "target 5-token window pass beside a draft thread looping 8-row branch "
                    "passes, over the pass alone (medians)",
                ),
                "draft_batch_step": fig(cal.draft_batch_s, "s", "median 8-row draft pass"),
            }
        ),
    }
