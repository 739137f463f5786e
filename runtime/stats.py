"""Run statistics from a stream of StepEvents (Spec-Bench conventions)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.decoding.events import StepEvent


@dataclass
class RunStats:
    """Accumulates per-step figures; `as_dict()` is the `stats` object of `--json`."""

    accept_lengths: list[int] = field(default_factory=list)  # committed per step (A + 1)
    accepted: list[int] = field(default_factory=list)  # A per step
    drafted: list[int] = field(default_factory=list)  # γ per step
    draft_s: float = 0.0
    verify_s: float = 0.0
    wall_s: float = 0.0
    prefill_tokens: int = 0
    extra: dict = field(default_factory=dict)
    per_step: dict = field(default_factory=dict)  # name -> list, from StepEvent.extra["per_step"]

    def add(self, ev: StepEvent, committed: int) -> None:
        for k, v in ev.extra.get("per_step", {}).items():
            self.per_step.setdefault(k, []).append(v)
        self.accept_lengths.append(committed)
        self.accepted.append(ev.accepted)
        self.drafted.append(ev.drafted)
        self.draft_s += ev.draft_s
        self.verify_s += ev.verify_s

    @property
    def new_tokens(self) -> int:
        return sum(self.accept_lengths)

    def as_dict(self) -> dict:
        steps = len(self.accept_lengths)
        drafted = sum(self.drafted)
        return {
            "steps": steps,
            "new_tokens": self.new_tokens,
            "accept_lengths": self.accept_lengths,
            "mean_accepted": self.new_tokens / steps if steps else 0.0,
            "acceptance_rate": sum(self.accepted) / drafted if drafted else None,
            # HeteroSpec's device-independent costs: target calls (one per step) and the tokens
            # they verified (the drafted ones + the root/last committed token per call)
            "calls": steps,
            "verified_tokens": drafted + steps,
            "tokens_per_s": self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0,
            "wall_s": self.wall_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "prompt_tokens": self.prefill_tokens,
            **({"per_step": self.per_step} if self.per_step else {}),
            **self.extra,
        }
