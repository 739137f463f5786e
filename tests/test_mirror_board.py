"""The board of completed branches (runtime/mirror/board.py): one contract, two implementations.

Each test runs against the in-process LocalBoard and the shared-memory SharedBoard (two
handles onto one buffer: the target's, which created it, and the draft's, attached by name);
one more drives the shared board across a real spawned process, and one checks that the
draft worker talks to the board it is given and to nothing else.
"""

import multiprocessing as mp

import numpy as np
import pytest

from runtime.mirror.board import Board, LocalBoard
from runtime.mirror.messages import Window
from runtime.mirror.shm_board import SharedBoard
from runtime.mirror.shm_channel import Layout

GAMMA, KAPPA, VOCAB = 3, 2, 16
LAYOUT = Layout(GAMMA, KAPPA, VOCAB, with_q=True)


def window(step: int, seed: int, own: bool = False, g: int = GAMMA) -> Window:
    """A completed branch's window for `step` (the board's step + 1), q as one array."""
    rng = np.random.default_rng(seed)
    q = rng.random((g, VOCAB), dtype=np.float32)
    info = {"ee_recv_ns": 10 + seed, "ready_ns": 20 + seed, "own": own}
    return Window(step, rng.integers(0, VOCAB, g).tolist(), q, 30 + seed, "reuse", info)


@pytest.fixture(params=["local", "shared"])
def sides(request):
    """(the worker's board, the target's board): one board seen from both sides."""
    if request.param == "local":
        b = LocalBoard()
        yield b, b
        return
    target = SharedBoard(LAYOUT, mp.get_context("spawn").Lock())
    worker = SharedBoard(LAYOUT, target.lock, target.name)
    try:
        yield worker, target
    finally:
        worker.release()
        target.release()


def same(got: Window, sent: Window) -> None:
    assert got.step == sent.step and got.tokens == sent.tokens and got.source == "reuse"
    np.testing.assert_array_equal(got.q, sent.q)
    assert got.info["own"] == sent.info["own"] and got.info["ready_ns"] == sent.info["ready_ns"]


def test_both_boards_have_the_boards_methods(sides):
    for b in sides:
        assert isinstance(b.stacked, bool)
        for name in ("open", "publish", "take", "claimed", "close"):
            assert callable(getattr(b, name)) and getattr(Board, name).__doc__, name


def test_publish_then_take_sees_the_same_window(sides):
    worker, target = sides
    worker.open(4)
    wins = {(1, 7): window(5, 1), (0, 3): window(5, 2, own=True, g=2)}
    worker.publish(4, wins)
    for key, w in wins.items():
        same(target.take(4, key), w)


def test_the_shared_board_takes_a_waves_rows_unstacked(sides):
    worker, target = sides
    w = window(5, 3)
    rows = Window(w.step, w.tokens, list(w.q), w.sent_ns, w.source, w.info)
    worker.open(4)
    worker.publish(4, {(2, 9): w if worker.stacked else rows})
    same(target.take(4, (2, 9)), w)


def test_claimed_reflects_a_take_and_a_miss_never_undoes_it(sides):
    worker, target = sides
    worker.open(0)
    worker.publish(0, {(1, 7): window(1, 1)})
    assert not worker.claimed()
    assert target.take(0, (1, 8)) is None and not worker.claimed()  # no such branch
    assert target.take(1, (1, 7)) is None and not worker.claimed()  # not that step's board
    assert target.take(0, (1, 7)) is not None and worker.claimed()
    assert target.take(1, (0, 2)) is None  # the target a step ahead: its miss keeps the claim
    assert worker.claimed() and target.claimed()
    assert worker.close() is True


def test_close_ends_takes_and_publishes_until_the_next_open(sides):
    worker, target = sides
    worker.open(2)
    worker.publish(2, {(0, 5): window(3, 4)})
    assert worker.close() is False  # nothing was taken
    assert target.take(2, (0, 5)) is None and not worker.claimed()
    worker.publish(2, {(0, 5): window(3, 4)})  # a pass that finished after the close
    assert target.take(2, (0, 5)) is None
    worker.open(3)  # a fresh board: empty and unclaimed
    assert target.take(3, (0, 5)) is None and not worker.claimed()
    worker.publish(2, {(0, 5): window(3, 4)})  # the closed step's branch: not this board's
    assert target.take(3, (0, 5)) is None
    worker.publish(3, {(0, 5): window(4, 5)})
    same(target.take(3, (0, 5)), window(4, 5))


def _draft_side(name: str, lock, conn) -> None:
    """A spawned process holding the worker's side: publish, then report the claim."""
    board = SharedBoard(LAYOUT, lock, name)
    board.open(6)
    board.publish(6, {(2, 11): window(7, 8, own=True)})
    conn.send("published")
    conn.recv()  # the target took it
    conn.send(board.close())
    board.release()


def test_the_shared_board_across_a_process():
    ctx = mp.get_context("spawn")
    target = SharedBoard(LAYOUT, ctx.Lock())
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_draft_side, args=(target.name, target.lock, there), daemon=True)
    proc.start()
    try:
        assert here.poll(60) and here.recv() == "published"
        same(target.take(6, (2, 11)), window(7, 8, own=True))
        here.send("taken")
        assert here.poll(10) and here.recv() is True  # the worker saw the claim on close
        assert target.take(6, (2, 11)) is None  # and the closed board gives nothing
    finally:
        proc.join(10)
        target.release()
    assert proc.exitcode == 0


def test_the_draft_worker_talks_to_the_board_it_is_given(tiny_dir, monkeypatch):
    """Greedy Mirror-SD with the worker's board recorded: one open and one close per step,
    every take through the board, and the output still the target's own."""
    from runtime.backends import load_model
    from runtime.decoding import Sampling, make_steps, run
    from runtime.mirror import draft_worker

    calls = []

    class Recording(LocalBoard):
        def __getattribute__(self, name):
            if name in ("open", "publish", "take", "close"):
                calls.append(name)
            return super().__getattribute__(name)

    monkeypatch.setattr(draft_worker, "LocalBoard", Recording)
    target = load_model(tiny_dir("qwen3"), "mlx")
    draft = load_model(tiny_dir("qwen3", num_layers=1, seed=4), "onnx")
    prompt = [11, 42, 7, 99, 5, 250]

    def go(method, d, **kw):
        steps = make_steps(method, target, d, prompt, max_new=24, sampling=Sampling(), seed=0, **kw)
        return run(steps, max_new=24)

    r = go("mirror", draft, gamma=3, draft_process=False)
    assert r.tokens == go("ar", None).tokens
    steps = len(r.stats.accept_lengths)
    assert calls.count("take") >= steps - 1  # every step but the last asks the board
    assert calls.count("open") >= steps - 1 and calls.count("close") >= steps - 1
    assert "publish" in calls
