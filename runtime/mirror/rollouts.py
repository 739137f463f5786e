"""One step's branch rollouts in Mirror-SD's draft worker, from the window to (A, c).

While the target runs its prefix the worker feeds d_γ (or, with own branches, re-runs the
window for the draft's own law) and rolls out its own runner-up branches; on the early-exit
message it ranks the hypothesis tree's branches and rolls them out in waves of
`branch_batch` rows, publishing each completed row on the board, until the final-verification
message arrives (work-conserving). The waves themselves are wave.py and ss_wave.py; the loop
around a step (messages, the next window: reuse, resume or fallback) is draft_worker.py.
"""

from __future__ import annotations

import numpy as np

from kernels.topk_channel import decode
from runtime.decoding.events import rewind, step_noise
from runtime.decoding.ss_draft import is_ss_draft
from runtime.mirror.branches import Branch, rank_branches, rank_own_branches
from runtime.mirror.coupled import rank_coupled, rank_own_coupled
from runtime.mirror.messages import EarlyExit, Window
from runtime.mirror.ss_wave import SSWave
from runtime.mirror.timeline import now_ns
from runtime.mirror.wave import Wave, fork_rows


class BranchRollouts:
    """The rollout stage of draft_worker.DraftWorker, which it is mixed into.

    Reads the worker's draft, sampling, seed, seq (committed), cache, tl, board, branch_batch
    and draft_branches; keeps the step's `_own_keys`, `_early` (the early exit, once read),
    `_ee_recv` and the step's noise in `_noise_step` / `_noise_uv`; asks the worker's
    `_get` (next message), `_final_arrived` (has (A, c) come?), `_window_size` and `_rng`."""

    def _rollouts(self, step: int, window, q, produced: int) -> tuple[int, list[Wave]]:
        """The step's branch rollouts until (A, c) comes: the draft's own branches while the
        target runs its prefix, then the early exit's. Returns (when the early exit came, the
        waves)."""
        self._ee_recv = 0  # not yet: branches published before it carry 0
        self._own_keys, self._early = set(), None
        own = self._extend(step, self.seq + window)
        early = self._own_rollouts(step, own, window, produced, q) if own is not None else []
        ee_recv, ranked = self._early or self._read_early(step, window, q)
        started = {key for w in early for key in w.index}
        ranked = [b for b in ranked if (b.depth, b.token) not in started]
        return ee_recv, early + self._waves(step, ranked, produced)

    def _publish(self, step: int, wave: Wave) -> None:
        """Post the rows this pass completed as ready windows for step + 1."""
        rows = wave.just_completed()
        if not rows.size:
            return
        info = {"ee_recv_ns": self._ee_recv, "ready_ns": wave.ready_ns[wave.k - 1],
                "source": "reuse", "fallback_ns": 0, "shared": True}  # fmt: skip
        done = set(rows.tolist())
        stack = self.board.stacked  # a shared board copies the wave's rows itself
        wins = {
            key: Window(
                step + 1,
                *wave.window(r, stack=stack),
                now_ns(),
                "reuse",
                {**info, "draft_passes": wave.row_passes(r), "own": key in self._own_keys},
                wave.logits,
            )
            for key, r in wave.index.items()
            if r in done
        }
        self.board.publish(step, wins)

    def _extend(self, step: int, full: list[int]) -> np.ndarray | None:
        """Feed what the cache lacks of committed + window (d_γ), while the target runs its
        prefix: every branch then shares this cache as its prefix. With draft branches, the
        feed re-runs the window from the last committed token instead and returns the draft's
        logits at window positions 0..γ, (γ + 1, V); else None."""
        t0 = now_ns()
        if self.draft_branches and len(full) > len(self.seq) >= 1:
            rewind(self.cache, len(self.seq) - 1)
            logits = self.draft.forward(np.array([full[len(self.seq) - 1 :]]), self.cache)[0]
            self.tl.add("draft", "re-run own window", t0, now_ns(), step=step)
            return logits
        if self.cache.offset < len(full):
            self.draft.forward(np.array([full[self.cache.offset :]]), self.cache)
            self.tl.add("draft", "extend own path", t0, now_ns(), step=step)
        return None

    def _read_early(self, step: int, window, q) -> tuple[int, list[Branch]]:
        """Read the early-exit message (blocking) and rank its branches, most likely first;
        kept in `_early` as (when it came, the ranked branches). `q`: the window's draft laws
        when sampling (the ranking is then the noise-coupled one of coupled.py)."""
        ee = self._get()
        assert isinstance(ee, EarlyExit) and ee.step == step
        ee_recv = self._ee_recv = now_ns()
        self.tl.add("channel", "early-exit", ee.sent_ns, ee_recv, step=step, bytes=len(ee.payload))
        ids, logp = decode(ee.payload)
        if self.sampling.greedy:
            ranked = rank_branches(ids, logp, window)
        else:  # the message is coupled to the verifier's noise, which we regenerate (coupled.py)
            u, noise = self._noise(step, window, q)
            ranked = rank_coupled(ids, logp, window, q, u, noise)
        self._early = (ee_recv, ranked)
        return self._early

    def _own_rollouts(self, step, logits, window, produced, q=None) -> list[Wave]:
        """Waves of the draft's own branches until the early exit arrives: its runner-ups when
        greedy; when sampling, the m·(γ+1) branches its own law, coupled to the verifier's
        noise as the early exit is, ranks first (coupled.rank_own_coupled)."""
        if self.sampling.greedy:
            ranked = rank_own_branches(logits, window, self.draft_branches)
        else:
            u, noise = self._noise(step, window, q)
            ranked = rank_own_coupled(
                self.sampling.log_probs(logits), window, q, u, noise, self.draft_branches
            )
        self._own_keys = {(b.depth, b.token) for b in ranked}
        return self._waves(step, ranked, produced, finish=True, window=window, q=q)

    def _noise(self, step, window, q):
        """The verifier's noise for `step` (events.step_noise): u and its Gumbel field."""
        if self._noise_step != step:
            vocab = q.shape[-1] if np.ndim(q) == 2 else self.draft.config.vocab_size
            self._noise_step, self._noise_uv = step, step_noise(self.seed, step, len(window), vocab)
        return self._noise_uv

    def _waves(
        self, step, ranked: list[Branch], produced, finish: bool = False, window=None, q=None
    ) -> list[Wave]:
        """Roll `ranked` out in waves of branch_batch rows until a message arrives. finish: the
        own branches' waves, which run to their end (they started a whole prefix earlier than
        any early-exit branch can, so at a γ whose rollout outlasts the suffix they are the only
        rows that can be complete when (A, c) comes); the early exit arriving meanwhile is read
        at once and its first branch_batch branches join the wave in flight (`Wave.join`),
        where they start a pass after it instead of after the wave's end (`window`, `q`: the
        step's, to rank them)."""
        waves = []
        base = len(self.seq)
        for i in range(0, len(ranked), self.branch_batch):
            if self._final_arrived() or (finish and self._early is not None):
                break
            chunk = ranked[i : i + self.branch_batch]
            g2, rngs = self._branch_rows(step, produced, base, chunk)
            kind = SSWave if is_ss_draft(self.draft) else Wave  # §3.2: η ≥ 1 tokens per pass
            wave = kind(
                self.draft, fork_rows(self.cache, chunk, base), chunk, base, g2, rngs, self.sampling
            )
            waves.append(wave)
            t0, joined = now_ns(), 0
            while not wave.finished():
                if finish and not joined and kind is Wave and self._final_arrived():
                    joined = self._join(step, waves, produced, base, window, q)
                own_left = finish and not (joined and wave.finished(len(chunk)))
                if wave.k and not own_left and self._final_arrived():
                    break
                wave.advance()
                self._publish(step, wave)
            self.tl.add(
                "draft",
                f"rollout wave {len(waves)}",
                t0,
                now_ns(),
                step=step,
                branches=len(chunk),
                tokens=wave.k,
                depths=sorted({b.depth for b in chunk}),
                joined=joined,
            )
            if not wave.finished():
                break
        return waves

    def _join(self, step, waves: list[Wave], produced, base, window, q) -> int:
        """The early exit came during an own wave (the last of `waves`): read it, and add its
        most likely branches not yet rolled out to that wave (at most branch_batch rows).
        Returns how many joined."""
        _, ranked = self._read_early(step, window, q)
        started = {key for w in waves for key in w.index}
        fresh = [b for b in ranked if (b.depth, b.token) not in started][: self.branch_batch]
        if fresh:
            waves[-1].join(fresh, *self._branch_rows(step, produced, base, fresh))
        return len(fresh)

    def _branch_rows(self, step: int, produced: int, base: int, branches: list[Branch]):
        """Per branch, the length of the window that would follow it and the generator it is
        drawn with (none when greedy: a wave's argmax reads no generator, and 16 keyed ones
        cost 0.2 ms a wave on a 2-core CPU)."""
        g2 = [self._window_size(produced + b.depth + 1, base + b.depth + 1) for b in branches]
        if self.sampling.greedy:
            return g2, [None] * len(branches)
        return g2, [self._rng(step + 1, b.depth, b.token) for b in branches]
