"""Mirror-SD with the draft worker in its own process (--draft-process): lossless, and a dead,
closed or interrupted worker leaves no generation running and no process behind."""

import multiprocessing as mp
import os
import signal

import pytest

from runtime.backends import load_model
from runtime.decoding import Sampling, make_steps, run
from runtime.errors import DuetError

PROMPT = [11, 42, 7, 99, 5, 250]


def steps(target, draft, n=24, temp=0.0, process=True, prompt=PROMPT, own=0):
    return make_steps(
        "mirror",
        target,
        draft,
        prompt,
        max_new=n,
        sampling=Sampling(temp),
        seed=3,
        gamma=3,
        kappa=4,
        draft_process=process,
        draft_branches=own,
    )


def no_draft_process() -> bool:
    return not any(p.name == "duet-draft-process" for p in mp.active_children())


@pytest.fixture(scope="module")
def pair(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx", intra_threads=1)
    yield target, draft
    host = getattr(draft, "_duet_draft_host", None)
    if host is not None:
        host.close()
    assert no_draft_process()


def test_process_worker_greedy_equals_ar(tiny_dir, arch):
    target = load_model(tiny_dir(arch), "mlx")
    draft = load_model(tiny_dir(arch, num_layers=1, seed=4), "onnx", intra_threads=1)
    ref = run(
        make_steps("ar", target, None, PROMPT, max_new=24, sampling=Sampling(), seed=0), max_new=24
    ).tokens
    assert run(steps(target, draft), max_new=24).tokens == ref
    # a second generation on the same process, its cache holding the first's prefix
    longer = PROMPT + ref[:5]
    ref2 = run(
        make_steps("ar", target, None, longer, max_new=12, sampling=Sampling(), seed=0), max_new=12
    ).tokens
    assert run(steps(target, draft, n=12, prompt=longer), max_new=12).tokens == ref2
    # the draft's own runner-up branches, published on the shared board (κ + m keys a step)
    assert run(steps(target, draft, own=2), max_new=24).tokens == ref
    draft._duet_draft_host.close()
    assert no_draft_process()


@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_sampled_mirror_commits_what_sampled_sd_commits_in_either_worker(pair, temp):
    """Each window is drawn with the generator keyed by (seed, step, A, c) and verified with
    the noise keyed by (seed, step), by sd as by mirror wherever its worker runs
    (events.window_rng, events.step_noise): at T > 0 the process worker, the thread worker,
    mirror with its own branches and sd commit the same tokens for a seed."""
    target, draft = pair
    thread = run(steps(target, draft, temp=temp, process=False), max_new=24)
    proc = run(steps(target, draft, temp=temp), max_new=24)
    assert proc.tokens == thread.tokens
    assert proc.stats.accept_lengths == thread.stats.accept_lengths
    assert run(steps(target, draft, temp=temp, own=2), max_new=24).tokens == thread.tokens

    def sd(seed):
        return run(
            make_steps(
                "sd", target, draft, PROMPT, max_new=24, sampling=Sampling(temp), seed=seed, gamma=3
            ),
            max_new=24,
        )

    same = sd(3)
    assert same.tokens == thread.tokens and same.stats.accept_lengths == thread.stats.accept_lengths
    assert sd(4).tokens != thread.tokens  # the seed decides: equal tokens are not a constant


def test_killed_worker_process_is_a_clear_error_and_leaves_nothing(pair):
    target, draft = pair
    gen = steps(target, draft, n=40)
    next(gen)
    host = draft._duet_draft_host
    os.kill(host.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"draft process \(pid \d+\) died"):
        for _ in gen:
            pass
    assert not host.alive and not host.proc.is_alive()
    assert no_draft_process()
    # the next generation starts a fresh process and is still lossless
    ref = run(steps(target, draft, process=False), max_new=24).tokens
    assert run(steps(target, draft), max_new=24).tokens == ref
    assert draft._duet_draft_host is not host


def test_closing_early_stops_the_child_generation(pair):
    target, draft = pair
    gen = steps(target, draft, n=40)
    got = next(gen).tokens + next(gen).tokens
    host = draft._duet_draft_host
    gen.close()
    # the child acknowledged the stop: it now caches (a prefix of) what was committed
    assert host.cached and host.cached == (PROMPT + got)[: len(host.cached)]
    assert len(host.cached) >= len(PROMPT)
    host.close()
    assert host.proc.exitcode == 0  # it quit when asked, not killed
    assert no_draft_process()


def test_interrupt_stops_the_generation_in_both_processes(pair):
    target, draft = pair
    gen = steps(target, draft, n=40)
    next(gen)
    host = draft._duet_draft_host
    with pytest.raises(KeyboardInterrupt):
        gen.throw(KeyboardInterrupt)
    assert host.alive and host.cached[: len(PROMPT)] == PROMPT
    # the process serves the next generation as if nothing happened
    ref = run(steps(target, draft, process=False), max_new=24).tokens
    assert run(steps(target, draft), max_new=24).tokens == ref


def test_a_draft_without_a_load_spec_is_refused(pair):
    target, draft = pair

    class Wrapped:  # a model with no path to load it from again (an in-memory model)
        config = draft.config
        backend = "onnx"

    with pytest.raises(DuetError, match="--draft-process needs a draft loaded from a path"):
        run(steps(target, Wrapped()), max_new=4)


def test_an_emulated_draft_runs_emulated_in_its_process(tiny_dir):
    """--emulate with --draft-process: the child loads the draft and wraps it in the same
    emulation (EmulateInProcess); greedy output still equals ar."""
    import pickle

    from devices.emulated_model import EmulatedModel, emulate_pair

    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx", intra_threads=1)
    emu, et, ed = emulate_pair("m3-max", target, draft)
    path, backend, kw, wrap = ed.process_spec
    assert (path, backend, kw) == draft.load_spec
    child = pickle.loads(pickle.dumps(wrap))(draft)  # what child_main does after loading
    assert isinstance(child, EmulatedModel) and child.role == "draft"
    assert child.emu.label == emu.label
    assert child.emu.predict("draft", 3) == emu.predict("draft", 3)
    ref = run(
        make_steps("ar", et, None, PROMPT, max_new=16, sampling=Sampling(), seed=0), max_new=16
    ).tokens
    assert emu.summary()["stages"]["draft"]["count"] == 0
    try:
        assert run(steps(et, ed, n=16), max_new=16).tokens == ref
        host = ed._duet_draft_host
        assert host.alive
        assert emu.summary()["stages"]["draft"]["count"] > 0  # the child's draft stages came home
    finally:
        ed._duet_draft_host.close()
    assert not host.proc.is_alive()  # (the module's `pair` fixture may hold its own process)


def test_a_completed_branch_is_taken_from_the_shared_board(pair):
    """§3.1 reuse across processes: the target takes the branch (A, c) the draft process
    published, at once, and the draft then sends no second copy of that window."""
    import time

    import numpy as np

    from kernels.topk_channel import encode
    from runtime.decoding.sd import draft_window
    from runtime.mirror.draft_process import ProcessDraftWorker, draft_host
    from runtime.mirror.messages import EarlyExit, FinalVerify
    from runtime.mirror.timeline import Timeline, now_ns

    _, draft = pair
    w = ProcessDraftWorker(
        draft_host(draft),
        sampling=Sampling(),
        seed=0,
        gamma=3,
        kappa=4,
        vocab=draft.config.vocab_size,
        max_new=100,
        ctx=256,
        timeline=Timeline(),
    )
    w.start(PROMPT)
    win = w.receive(0)
    c = (win.tokens[1] + 3) % 300
    ids = np.array(
        [
            [win.tokens[0], 300, 301, 302],
            [win.tokens[1], c, 303, 304],
            [win.tokens[2], 305, 306, 307],
            [308, 309, 310, 311],
        ]
    )
    w.send(
        EarlyExit(0, encode(ids.astype(np.int32), np.full(ids.shape, -1.6, np.float32)), now_ns())
    )
    deadline = time.time() + 20
    while (got := w.take(0, 1, c)) is None:  # published when its wave's last pass ends
        assert time.time() < deadline
        time.sleep(0.002)
    w.send(FinalVerify(0, 1, c, now_ns()))
    seq = PROMPT + win.tokens[:1] + [c]
    fresh = draft_window(draft, draft.new_cache(), seq, 3, Sampling(), None)[0]
    assert got.source == "reuse" and got.step == 1 and got.tokens == fresh
    assert not w.host.conn.poll(0.3)  # claimed: the draft sends no second copy
    w.finish(seq)  # no window was sent for step 1: the stop is acknowledged, nothing else
    assert draft._duet_draft_host.cached == seq[: len(draft._duet_draft_host.cached)]


def test_a_second_early_exit_sent_before_the_first_is_read_does_not_overwrite_it():
    """The channel holds a step's messages until read: a target that took Window(s+1) from
    the board (an own-branch row the draft published before reading EarlyExit(s)) sends
    EarlyExit(s+1) and FinalVerify(s+1) while the draft is still in its own wave; the draft
    must then read EarlyExit(s), FinalVerify(s), EarlyExit(s+1), FinalVerify(s+1) in order.
    (One EE slot gave it EarlyExit(s+1) twice: an H100 target's T = 1 run failed so.)"""
    import numpy as np

    from kernels.topk_channel import encode
    from runtime.mirror.draft_child import _PipeInbox
    from runtime.mirror.draft_process import ProcessDraftWorker
    from runtime.mirror.messages import EarlyExit, FinalVerify
    from runtime.mirror.shm_channel import Layout, Slots

    class PipeHost:  # the target's end of the pipe, without a draft process behind it
        def __init__(self, conn):
            self.conn = conn

        def send(self, data):
            self.conn.send_bytes(data)

    target_end, draft_end = mp.Pipe()
    w = ProcessDraftWorker.__new__(ProcessDraftWorker)
    w.slots, w.host = Slots(Layout(gamma=3, kappa=4, vocab=512, with_q=False)), PipeHost(target_end)
    reader = Slots(w.slots.layout, w.slots.names)
    inbox = _PipeInbox(draft_end, reader)
    ids = np.arange(16, dtype=np.int32).reshape(4, 4)
    sent = []
    for step in (4, 5):  # two steps' messages before the draft reads any
        payload = encode(ids + step, np.full(ids.shape, -0.5 * step, np.float32))
        sent += [
            EarlyExit(step, payload, 1000 + step),
            FinalVerify(step, step - 3, 40 + step, 2000 + step),
        ]
        w.send(sent[-2])
        w.send(sent[-1])
    try:
        assert [inbox.get(1.0) for _ in sent] == sent
    finally:
        reader.close()
        w.slots.close()
        target_end.close()
        draft_end.close()


def test_auto_measures_the_slowdown_beside_the_draft_process_it_would_run(pair):
    """The probe's busy loop runs in the draft's own process (the worker mirror would use)
    and leaves it serving generations: the next mirror run still equals ar."""
    import numpy as np

    from devices.pair_stages import _slowdown_process

    target, draft = pair
    cache = target.new_cache()
    target.forward(np.array([PROMPT]), cache)

    def tpass():
        target.forward(np.array([PROMPT[:4]]), cache)
        cache.trim(4)

    host = __import__("runtime.mirror.draft_process", fromlist=["draft_host"]).draft_host(draft)
    with host.busy(4):  # the loop is running: the pipe answers only when it stops
        assert not host.conn.poll(0.05)
    s = _slowdown_process(draft, np.array([PROMPT]), 4, tpass, repeats=3)
    assert isinstance(s, float) and 0.2 < s < 20
    assert draft._duet_draft_host is host and host.alive  # the same process, kept
    ref = run(
        make_steps("ar", target, None, PROMPT, max_new=16, sampling=Sampling(), seed=0), max_new=16
    ).tokens
    assert run(steps(target, draft, n=16), max_new=16).tokens == ref


def test_a_draft_process_that_fails_its_busy_loop_takes_mirror_out_of_autos_choice(
    pair, monkeypatch
):
    """As with the thread probe: a draft that cannot loop beside the target gives no slowdown
    (None: choose_for then drops mirror) instead of an error out of `--method auto`."""
    from contextlib import contextmanager

    import numpy as np

    from devices.pair_stages import _slowdown_process
    from runtime.mirror.draft_process import draft_host

    _, draft = pair
    host = draft_host(draft)

    @contextmanager
    def failing(branches):
        raise RuntimeError("the Mirror-SD draft process died")
        yield

    monkeypatch.setattr(host, "busy", failing)
    assert _slowdown_process(draft, np.array([PROMPT]), 4, lambda: None, repeats=1) is None


def test_the_draft_process_sets_torchs_threads_before_ready_greedy_or_not(tiny_dir):
    """The row kernels (greedy too: the own branches' log-softmax) run on PyTorch; the worker
    loads it on the draft's thread budget before READY. Loaded at a sampled generation's start
    only, a greedy run had imported it inside its first step at every core (mirror at T = 0
    0.51x sd on an H100, 0.78x here). child_main runs here, in this process, until QUIT."""
    import torch

    from runtime.mirror import shm_channel as wire
    from runtime.mirror.draft_child import child_main

    spec = (str(tiny_dir("qwen3", num_layers=1, seed=4)), "onnx", {"intra_threads": 1})
    ours, theirs = mp.Pipe()
    ours.send_bytes(wire.QUIT)
    before, handler = torch.get_num_threads(), signal.getsignal(signal.SIGINT)
    torch.set_num_threads(2)
    try:
        child_main(theirs, spec, None)
        assert ours.recv_bytes() == wire.READY
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        signal.signal(signal.SIGINT, handler)


def test_each_steps_branch_hit_is_the_same_in_either_worker_and_fits_its_window(pair):
    """branch_hit (auto's Ω̂ and Ω̂_own, pair_probe.observe_branches) says whether a step's
    (A, c) was among the draft's own runner-ups or the early exit's top-κ: a fact of the
    ranking, not of timing, so the thread and the process worker (whose board carries the
    flag for a window the target takes) agree; a miss is never reused, an early-exit hit is
    in the tree, and without own branches no step is an own hit."""

    def hits(process, own, temp):
        evs = list(steps(target, draft, n=40, temp=temp, process=process, own=own))
        return [
            (
                e.extra["per_step"]["branch_hit"],
                e.extra["in_tree"],
                e.extra.get("reuse"),
                e.extra.get("taken"),
            )
            for e in evs
        ]

    target, draft = pair
    for temp in (0.0, 1.0):
        thread, proc = hits(False, 2, temp), hits(True, 2, temp)
        assert [h[0] for h in thread] == [h[0] for h in proc]
        assert thread[-1][0] is None and {h[0] for h in thread[:-1]} <= {"own", "exit", "miss"}
        for hit, tree, reuse, _ in thread + proc:
            assert hit != "miss" or not reuse
            assert hit != "exit" or tree
    assert any(h[0] == "own" for h in thread)  # at T = 1 (the tiny greedy pair has none)
    assert "own" not in {h[0] for h in hits(True, 0, 1.0)}
