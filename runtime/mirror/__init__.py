"""Mirror speculative decoding (Mirror-SD): the target and the draft compute at once.

  messages.py     the three messages that cross the token channel
  timeline.py     one clock for both threads; Chrome-trace export
  branches.py     branch-complete rollout planning and the §3.1 reuse rule
  board.py        the board of completed branches: the interface, and the in-process one
  draft_worker.py the draft's thread: its loop, and reuse, resume or fallback
  rollouts.py     one step's branch rollouts in waves, until (A, c) comes
  draft_process.py the same worker in its own process (--draft-process)
  draft_host.py   the draft process's handle on the target's side: spawn, pipe, close
  draft_child.py  what the draft process runs: load the draft, serve generations
  shm_channel.py  the messages as shared-memory slots + a pipe, between processes
  shm_board.py    the board of completed branches in shared memory, between processes
  exit_head.py    the tuned exit head applied before the early-exit LM head
  verdict.py      one step's verdict on the target's side, and the figures the step reports
  summary.py      per-run figures: overlap, T_rv, reuse, FF, Ω_κ, eq. (10)

The target side is the generator in runtime/decoding/mirror.py (its steps: mirror_pass.py).
"""
