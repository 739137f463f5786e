"""The Mirror-SD draft worker in its own process (`--draft-process`): the target's side.

`ProcessDraftWorker` offers DraftWorker's target-side interface (start, send, receive, take,
finish) over a draft process: draft_host.py spawns it and holds its pipe, draft_child.py is
what it runs (the unchanged DraftWorker loop over the shared-memory channel, shm_channel.py).

Failure behaviour is the thread worker's: a worker exception comes back as an error; a process
that dies is raised as one clear RuntimeError; closing the generator early or Ctrl-C ends the
generation (the target's `finally` stops it), and a child that does not answer the stop within
STOP_TIMEOUT_S is taken down.

The board of completed branches (board.Board) is shared too: both sides hold a
shm_board.SharedBoard (under a multiprocessing Lock), which the child injects into the
unchanged DraftWorker; on reuse the target takes its next window at once, as with the thread
worker. An emulated draft's stage records, sent home at the end of each generation, go to the
parent's `import_records` (the emulator's summary then counts the draft's stages too).
"""

from __future__ import annotations

import pickle
import time

from runtime.decoding.events import Sampling, common_prefix
from runtime.mirror import shm_channel as wire
from runtime.mirror.draft_host import STOP_TIMEOUT_S, DraftHost, close_draft_hosts, draft_host
from runtime.mirror.draft_worker import DEFAULT_BRANCH_BATCH
from runtime.mirror.messages import EarlyExit, FinalVerify, Window
from runtime.mirror.shm_board import SharedBoard
from runtime.mirror.shm_channel import Layout, Slots
from runtime.mirror.timeline import Timeline, now_ns

# the target's entry points to the draft process, whichever of its files holds them
__all__ = ["ProcessDraftWorker", "close_draft_hosts", "draft_host"]


class ProcessDraftWorker:
    """DraftWorker's target-side interface over a DraftHost and the shared-memory slots."""

    def __init__(
        self,
        host: DraftHost,
        *,
        sampling: Sampling,
        seed: int,
        gamma: int,
        kappa: int,
        vocab: int,
        max_new: int,
        ctx: int,
        timeline: Timeline,
        branch_batch: int = DEFAULT_BRANCH_BATCH,
        draft_branches: int = 0,
    ):
        self.host, self.tl = host, timeline
        # the board holds every branch key: κ early-exit and m draft candidates per position
        layout = Layout(gamma, kappa + draft_branches, vocab, not sampling.greedy)
        self.slots = Slots(layout)
        self.board = SharedBoard(layout, host.lock)
        self.args = dict(
            sampling=sampling,
            seed=seed,
            gamma=gamma,
            max_new=max_new,
            ctx=ctx,
            branch_batch=branch_batch,
            draft_branches=draft_branches,
        )

    def start(self, seq: list[int]) -> None:
        keep = common_prefix(self.host.cached, seq)
        args = dict(
            self.args,
            seq=list(seq),
            keep=keep,
            names=self.slots.names,
            board=self.board.name,
            layout=self.slots.layout,
        )
        self.host.send(wire.BEGIN + pickle.dumps(args))

    def send(self, msg) -> None:
        if isinstance(msg, EarlyExit):
            slot = self.slots.put_early_exit(msg)
            self.host.send(wire.EE + bytes([slot]))
        else:
            assert isinstance(msg, FinalVerify)
            slot = self.slots.put_final(msg)
            self.host.send(wire.FV + bytes([slot]))

    def receive(self, step: int) -> Window:
        """The window for `step`; raises promptly if the worker failed or its process died."""
        tag = self.host.recv()
        if tag[:1] == wire.FAIL:
            raise RuntimeError(f"Mirror-SD draft process failed: {tag[1:].decode()}")
        assert tag[:1] == wire.WIN, f"unexpected message {tag[:1]!r} from the draft process"
        win = self.slots.get_window()
        self._add_intervals(win.info.pop("intervals", []))
        assert win.step == step, f"window for step {win.step}, expected {step}"
        self.tl.add("channel", "window", win.sent_ns, now_ns(), step=step, source=win.source)
        return win

    def take(self, step: int, accepted: int, token: int) -> Window | None:
        """The target's side of reuse: the completed branch (A, c) of `step` from the shared
        board, if the draft published it; the draft then does not send that window again."""
        return self.board.take(step, (accepted, token))

    def finish(self, seq: list[int], draft_cache=None) -> None:
        """Stop this generation; the child keeps the committed prefix of `seq` cached.

        `draft_cache` (the caller's in-process cache) is left as it was: it never ran here."""
        try:
            if self.host.alive:
                self.host.send(wire.STOP_TAG + str(len(seq)).encode())
                deadline = time.monotonic() + STOP_TIMEOUT_S
                while (tag := self.host.recv(max(0.0, deadline - time.monotonic())))[
                    :1
                ] != wire.IDLE:
                    pass  # a window or failure sent before the stop arrived
                kept, ivs, recs = pickle.loads(tag[1:])
                self.host.cached = list(seq[:kept])
                self._add_intervals(ivs)
                if recs and self.host.import_records is not None:
                    self.host.import_records(recs)
        except TimeoutError:
            self.host.close()
        except RuntimeError:  # it died: already reaped, and reported by receive if it mattered
            pass
        finally:
            self.slots.close()
            self.board.release()

    def _add_intervals(self, ivs) -> None:
        for lane, name, s, e, args in ivs:
            self.tl.add(lane, name, s, e, **args)
