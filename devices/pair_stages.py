"""Stage times `--method auto` needs (devices/method_choice.StageTimes), measured on the pair.

Stage times (medians, after a warm-up pass each):
  target_token / target_window  the target's 1-token and (γ+1)-token passes, alone;
  mirror_window                 mirror's own (γ+1)-token pass alone: split at ℓe, with the
                                early-exit head and message (mirror_pass);
  draft_window                  sd's γ drafts: γ 1-row passes back to back with their draws
                                (the first after a target pass, as in a step: colder caches);
  draft_token / draft_batch     the draft's 1-row pass, and one pass of a `branches`-row
                                branch wave as the worker runs it (wave_pass);
  target_slowdown               the target's window pass while the draft loops batched
                                passes beside it (as Mirror-SD's worker does: in a thread, or
                                in its own process where mirror would run it so), over it alone;
  t_rv                          a queue round trip between two threads (measure_rendezvous).
The passes are built as their methods run them (devices/pair_passes.py); this module times them.
A calibrated profile (`python -m devices calibrate`) may supply the stage times instead
(`from_profile`); it is then named as their source. Cached per (target, draft, γ, branches)
for the life of the process (devices/probe_memo.py).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time

import numpy as np

from devices import probe_memo as memo
from devices.pair_passes import mirror_pass, sd_drafts, wave_pass


def measure_rendezvous(*, trials: int = 500, kappa: int = 4, gamma: int = 7) -> float:
    """Median round trip (s) of a top-κ message between two threads through queue.Queue.

    The payload is what Mirror-SD's early-exit message carries: (γ+1, κ) ids and
    bf16-sized log-probs. One round trip = two one-way handoffs = T_rv(ee) + T_rv(fv).
    """
    to_draft, to_target = queue.Queue(), queue.Queue()
    ids = np.zeros((gamma + 1, kappa), dtype=np.int64)
    logp = np.zeros((gamma + 1, kappa), dtype=np.float16)

    def draft_side():
        while (msg := to_draft.get()) is not None:
            to_target.put(msg)

    th = threading.Thread(target=draft_side, daemon=True)
    th.start()
    times = []
    try:
        for _ in range(trials):
            t0 = time.perf_counter()
            to_draft.put((ids, logp))
            to_target.get()
            times.append(time.perf_counter() - t0)
    finally:
        to_draft.put(None)
        th.join()
    return statistics.median(times)


def _medians(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, the functions interleaved round by round, so that a
    machine whose load drifts (other processes) biases none of them against the others."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats + 1):  # round 0 warms up
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def measure_stages(
    target,
    draft,
    *,
    gamma: int,
    branches: int,
    repeats: int = 15,
    process: bool = False,
    sampling=None,
    kappa: int = 8,
    exit_layer: int | None = None,
    exit_head: str | None = None,
    mirror: bool = True,
) -> dict:
    """The stage times of the module docstring, in seconds (cached per pair and shape).
    process: the slowdown beside the draft *process* (Mirror-SD's worker there, as beside a
    CUDA target: runtime.decoding.mirror.draft_in_process), not a thread. sampling, kappa,
    exit_layer, exit_head: mirror's, for its own pass (`mirror_pass`). mirror=False (a pair
    mirror cannot run: runnable_methods): only ar's and sd's figures; nothing forks the
    draft's rows (a draft that drafts one row only, `--draft mtp`, refuses to)."""
    greedy = sampling is None or sampling.greedy
    key = (id(target), id(draft), gamma, branches, process, greedy, kappa, exit_layer, exit_head,
           mirror)  # fmt: skip
    if key in memo.CACHE:
        return memo.CACHE[key]
    rng = np.random.default_rng(0)
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    prompt = rng.integers(0, vocab, size=(1, 64), dtype=np.int64)
    tc, dc = target.new_cache(), draft.new_cache()
    target.forward(prompt, tc)
    draft.forward(prompt, dc)
    window = prompt[:, : gamma + 1]

    def tpass(x):
        target.forward(x, tc)
        tc.trim(x.shape[1])

    def dpass(x, cache):
        draft.forward(x, cache)
        cache.trim(x.shape[1])

    fns = {"target_token": lambda: tpass(prompt[:, :1]),
           "target_window": lambda: tpass(window),
           "draft_window": sd_drafts(draft, prompt, gamma, sampling),
           "draft_token": lambda: dpass(prompt[:, :1], dc)}  # fmt: skip
    if mirror:
        fns["draft_batch"] = wave_pass(draft, dc, branches=branches, gamma=gamma, sampling=sampling)
        shape = dict(kappa=kappa, exit_layer=exit_layer, exit_head=exit_head, greedy=greedy)
        if (mpass := mirror_pass(target, tc, window, **shape)) is not None:
            fns["mirror_window"] = mpass
    out = _medians(fns, repeats)
    if mirror:
        out["draft_batch"] /= max(1, gamma)  # wave_pass runs a whole γ-deep wave
        slowdown = _slowdown_process if process else _slowdown
        out["target_slowdown"] = slowdown(draft, prompt, branches, lambda: tpass(window), repeats)
        out["t_rv"] = measure_rendezvous(trials=200)
        out["source"] = "measured on this machine on the pair at hand"
    else:  # mirror's own figures, unmeasured: neutral values it is never judged by
        out.update(
            draft_batch=out["draft_token"],
            target_slowdown=1.0,
            t_rv=0.0,
            source="measured on this machine on the pair at hand (ar and sd only)",
        )
    memo.CACHE[key] = out
    return out


def measure_windows(
    target,
    gammas,
    *,
    kappa: int = 8,
    exit_layer: int | None = None,
    exit_head: str | None = None,
    greedy: bool = True,
    draft=None,
    sampling=None,
    repeats: int = 9,
    mirror: bool = True,
) -> dict[int, dict]:
    """{γ: {"target_window", "mirror_window", "draft_window"}}: the (γ+1)-token passes alone
    and, with a draft, sd's γ drafts (sd_drafts), per γ (what `choose_joint` needs beyond one
    γ's stage times). All γ are timed round-robin in one `_medians`, so a machine's drifting
    load biases no γ against another, and each draft window follows a target pass as in a
    step; cached per set."""
    gammas = tuple(sorted(set(gammas)))
    key = ("windows", id(target), id(draft), gammas, kappa, exit_layer, exit_head, greedy, mirror)
    if key not in memo.CACHE:
        rng = np.random.default_rng(0)
        prompt = rng.integers(0, target.config.vocab_size, size=(1, 64), dtype=np.int64)
        tc = target.new_cache()
        target.forward(prompt, tc)
        fns = {}
        shape = dict(kappa=kappa, exit_layer=exit_layer, exit_head=exit_head, greedy=greedy)
        for g in gammas:
            window = prompt[:, : g + 1]

            def tpass(x=window):
                target.forward(x, tc)
                tc.trim(x.shape[1])

            fns[(g, "target_window")] = tpass
            if draft is not None:
                fns[(g, "draft_window")] = sd_drafts(draft, prompt, g, sampling)
            if mirror and (mpass := mirror_pass(target, tc, window, **shape)) is not None:
                fns[(g, "mirror_window")] = mpass
        med = _medians(fns, repeats)
        raw = {g: {name: v for (h, name), v in med.items() if h == g} for g in gammas}
        memo.CACHE[key] = _affine_in_gamma(raw)
    return memo.CACHE[key]


def _affine_in_gamma(raw: dict[int, dict]) -> dict[int, dict]:
    """Each pass's medians over γ replaced by their least-squares line in γ (FlexSpec eq. 9:
    T(K) = T_base + K·δ), slope ≥ 0. A verification pass's cost is affine in its window, and
    the medians alone are not monotone on a loaded machine (this CPU: 18.2 ms at γ 4 and
    16.2 ms at γ 5 in one probe), which is enough to flip the γ auto picks."""
    if len(raw) < 3:
        return raw
    out = {g: dict(v) for g, v in raw.items()}
    for name in {n for v in raw.values() for n in v}:
        gs = [g for g in raw if name in raw[g]]
        ys = np.array([raw[g][name] for g in gs])
        slope, base = np.polyfit(np.array(gs, float), ys, 1)
        if slope < 0:
            slope, base = 0.0, float(ys.mean())
        for g in gs:
            out[g][name] = float(base + slope * g)  # eq. (9)
    return out


def _slowdown(draft, prompt, branches: int, tpass, repeats: int) -> float | None:
    """Target pass beside a draft thread looping branch passes / the pass alone: rounds
    alternate the draft on and off, so load drifting on a shared machine cancels out.
    None when the draft cannot run in another thread (then neither can Mirror-SD's worker)."""
    side = draft.new_cache()
    draft.forward(prompt, side)
    side = side.fork([0] * branches)
    x = np.repeat(prompt[:, :1], branches, 0)
    go, stop, idle = threading.Event(), threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def loop():
        try:
            while not stop.is_set():
                if not go.wait(0.005):
                    idle.set()
                    continue
                idle.clear()
                draft.forward(x, side)
                side.trim(1)
        except Exception as e:  # e.g. an MLX draft, whose stream belongs to the loading thread
            failed.append(e)
            idle.set()

    th = threading.Thread(target=loop, name="duet-probe-draft", daemon=True)
    th.start()
    alone, beside = [], []
    try:
        for r in range(repeats + 1):
            go.clear()
            idle.wait(1.0)
            t0 = time.perf_counter()
            tpass()
            a = time.perf_counter() - t0
            go.set()
            time.sleep(0.001)  # the draft is computing when the target starts
            t0 = time.perf_counter()
            tpass()
            if r:  # round 0 warms up
                alone.append(a)
                beside.append(time.perf_counter() - t0)
    finally:
        stop.set()
        go.set()
        th.join()
    return None if failed else statistics.median(beside) / statistics.median(alone)


def _slowdown_process(draft, prompt, branches: int, tpass, repeats: int) -> float | None:
    """_slowdown with the draft looping in its own process (runtime/mirror/draft_process.py):
    there it takes no GIL from the target, only what the two processes share."""
    from runtime.mirror.draft_process import draft_host

    try:
        host = draft_host(draft)
    except Exception:  # noqa: BLE001 (no load spec, or it failed to load: mirror cannot run)
        return None
    alone, beside = [], []
    try:
        for r in range(repeats + 1):  # round 0 warms up; rounds alternate the draft off and on
            t0 = time.perf_counter()
            tpass()
            a = time.perf_counter() - t0
            with host.busy(branches):
                t0 = time.perf_counter()
                tpass()
                b = time.perf_counter() - t0
            if r:
                alone.append(a)
                beside.append(b)
    except (RuntimeError, TimeoutError):  # the draft failed in its process: as _slowdown's None
        return None
    return statistics.median(beside) / statistics.median(alone)


def from_profile(profile, *, gamma: int, branches: int) -> dict:
    """Stage times from a calibrated profile's latency figures (FlexSpec eq. 9 fits and T_rv)."""
    lat = profile.latency
    t_base, delta = profile.param("t_base"), profile.param("delta_cloud")
    alpha = profile.param("alpha_edge")
    out = {
        "target_token": t_base,
        "target_window": t_base + gamma * delta,  # eq. (9) at K = γ
        "draft_token": alpha,
        "draft_batch": lat["draft_batch_step"].si if "draft_batch_step" in lat else alpha,
        "target_slowdown": lat["target_slowdown"].si if "target_slowdown" in lat else 1.0,
        "t_rv": profile.param("t_rv"),
        "source": f"profile {profile.name} ({profile.latency['t_base'].source})",
    }
    return out
