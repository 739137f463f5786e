"""The token channel between two processes: shared-memory slots, and a pipe that rings.

The Mirror-SD draft process (draft_process.py) and the target exchange exactly the
thread worker's messages (messages.py). The bulk of each — the early-exit payload
(§3.1: top-κ ids + bf16 log-probs), the final verdict (A, c), the window's tokens and
their q — is written into `multiprocessing.shared_memory` buffers (the standard library's
named shared memory: no copy through a pipe or pickle for the window's γ×V floats); a
one-byte tag sent over a `multiprocessing` Pipe says which slot was just written.

Why these slots suffice: the target sends a message of step s+1 only once it holds
Window(s+1). The draft publishes a row of its own runner-ups on the board (shm_board.py)
before it has read EarlyExit(s) (own-branch rows start in the target's prefix, and the wave
runs to its end), so a target that takes Window(s+1) from the board can send EarlyExit(s+1)
and FinalVerify(s+1) before the draft has read EarlyExit(s) and FinalVerify(s). Never a
message of step s+2: that needs Window(s+2), which needs the draft past FinalVerify(s). So
each message type has two slots, by step parity, and the pipe's tag names the slot. (With
one EarlyExit slot, a fast target overwrote EarlyExit(s) before the draft read it: seen on
an H100 target with the draft on the CPU, T = 1.)

Not here: the board of completed branches (shm_board.py), the worker's rollouts
(draft_worker.py) and the process's life (draft_process.py).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from runtime.mirror.messages import EarlyExit, FinalVerify, Window

EE, FV, WIN, STOP_TAG, FAIL, IDLE, BEGIN, QUIT, READY, BUSY = (
    b"E", b"F", b"W", b"S", b"X", b"I", b"B", b"Q", b"R", b"L"
)  # fmt: skip
INFO_CAP = 1 << 20  # bytes for a window's pickled info (timings, the draft lane's intervals)


@dataclass(frozen=True)
class Layout:
    """Slot sizes for one generation: γ, κ and the vocabulary fix every buffer's shape."""

    gamma: int
    kappa: int
    vocab: int
    with_q: bool  # sampling sends q; greedy verification needs none

    @property
    def ee_cap(self) -> int:
        return 4 + (self.gamma + 1) * self.kappa * 6  # kernels.topk_channel wire format

    @property
    def ee_slot(self) -> int:  # one EE slot: header (3 i64) + payload, padded to 8 bytes
        return 8 * 3 + self.ee_cap + (-self.ee_cap) % 8

    @property
    def down_bytes(self) -> int:  # target -> draft: two EE slots, two FV slots (4 i64 each)
        return 2 * self.ee_slot + 8 * 8

    @property
    def q_rows(self) -> int:
        return self.gamma if self.with_q else 0

    @property
    def up_bytes(self) -> int:  # draft -> target: header (5 i64), tokens, q, info
        return 8 * 5 + 8 * self.gamma + 4 * self.q_rows * self.vocab + INFO_CAP


class Slots:
    """Typed views onto the two shared buffers (either side; `create` on the target's)."""

    def __init__(self, layout: Layout, names: tuple[str, str] | None = None):
        self.layout = L = layout
        if names is None:
            self.down = shared_memory.SharedMemory(create=True, size=L.down_bytes)
            self.up = shared_memory.SharedMemory(create=True, size=L.up_bytes)
            self.owner = True
        else:
            self.down = shared_memory.SharedMemory(name=names[0])
            self.up = shared_memory.SharedMemory(name=names[1])
            # a spawned child shares its parent's resource tracker, which the creator's unlink
            # unregisters: the child must not unregister too
            self.owner = False
        d, u = self.down.buf, self.up.buf
        es = L.ee_slot  # [step % 2]: header (step, sent_ns, nbytes), then the payload
        self.ee_head = [np.ndarray((3,), np.int64, d, i * es) for i in (0, 1)]
        self.ee_body = [d[i * es + 24 : i * es + 24 + L.ee_cap] for i in (0, 1)]
        self.fv = np.ndarray((2, 4), np.int64, d, 2 * es)  # [step % 2]: step, A, c, sent
        self.win_head = np.ndarray((5,), np.int64, u, 0)  # step, n, sent_ns, q rows, info bytes
        self.win_toks = np.ndarray((L.gamma,), np.int64, u, 40)
        q_at = 40 + 8 * L.gamma
        self.win_q = np.ndarray((L.q_rows, L.vocab), np.float32, u, q_at)
        info_at = q_at + 4 * L.q_rows * L.vocab
        self.win_info = u[info_at : info_at + INFO_CAP]

    @property
    def names(self) -> tuple[str, str]:
        return self.down.name, self.up.name

    # ---- target -> draft ---------------------------------------------------------------------
    def put_early_exit(self, m: EarlyExit) -> int:
        """Write the early exit into the slot of its step's parity; returns that slot."""
        n = len(m.payload)
        assert n <= self.layout.ee_cap, f"early-exit payload {n} B > slot {self.layout.ee_cap} B"
        slot = m.step % 2
        self.ee_body[slot][:n] = m.payload
        self.ee_head[slot][:] = (m.step, m.sent_ns, n)
        return slot

    def get_early_exit(self, slot: int) -> EarlyExit:
        step, sent, n = (int(x) for x in self.ee_head[slot])
        return EarlyExit(step, bytes(self.ee_body[slot][:n]), sent)

    def put_final(self, m: FinalVerify) -> int:
        """Write (A, c) into the slot of its step's parity; returns that slot."""
        self.fv[m.step % 2] = (m.step, m.accepted, m.token, m.sent_ns)
        return m.step % 2

    def get_final(self, slot: int) -> FinalVerify:
        step, a, c, sent = (int(x) for x in self.fv[slot])
        return FinalVerify(step, a, c, sent)

    # ---- draft -> target ---------------------------------------------------------------------
    def put_window(self, w: Window) -> None:
        n = len(w.tokens)
        info = pickle.dumps((w.source, w.info), protocol=pickle.HIGHEST_PROTOCOL)
        if len(info) > INFO_CAP:  # the intervals are a report, not the protocol: drop them
            info = pickle.dumps((w.source, {k: v for k, v in w.info.items() if k != "intervals"}))
        self.win_toks[:n] = w.tokens
        rows = len(w.q) if self.layout.with_q else 0
        if rows:
            self.win_q[:rows] = w.q
        self.win_info[: len(info)] = info
        self.win_head[:] = (w.step, n, w.sent_ns, rows, len(info))

    def get_window(self) -> Window:
        step, n, sent, rows, ni = (int(x) for x in self.win_head)
        source, info = pickle.loads(bytes(self.win_info[:ni]))
        q = self.win_q[:rows].copy() if rows else np.zeros((0, self.layout.vocab), np.float32)
        return Window(step, self.win_toks[:n].tolist(), q, sent, source, info)

    def close(self) -> None:
        """Drop the views, then the mappings; the creating side also unlinks the names."""
        self.ee_head = self.ee_body = self.fv = None
        self.win_head = self.win_toks = self.win_q = self.win_info = None
        for shm in (self.down, self.up):
            try:
                shm.close()
            except BufferError:  # a view still alive elsewhere: the mapping goes with the process
                pass
            if self.owner:
                try:
                    shm.unlink()
                except FileNotFoundError:
                    pass
